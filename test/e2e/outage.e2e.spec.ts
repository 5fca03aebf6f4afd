import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { RedisService } from 'nest-rate-limit/store';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { type Sample, sequential } from '../support/traffic.js';

@Controller('steady')
class SteadyController {
  @Get()
  @RateLimit({ count: 1_000_000, window: '1m', by: 'global' })
  get() {
    return {};
  }
}

/** Steady traffic from 4 sequential clients, for `durationMs` of real time (at most 2,000 requests each). */
async function steadyTraffic(app: INestApplication, durationMs: number): Promise<Sample[]> {
  const send = () => request(app.getHttpServer()).get('/steady');
  return (await sequential(4 * 2_000, send, { clients: 4, durationMs })).samples;
}

/** How long a request waited for its answer. */
const latency = (sample: Sample) => sample.answeredAt - sample.sentAt;

/** Polls with a little traffic until Redis decides again (its breaker probes on its own schedule). */
const backOnRedis = (app: INestApplication) =>
  until(async () => (await steadyTraffic(app, 50)).some((s) => s.fromRedis), {
    timeoutMs: 5_000,
    intervalMs: 100,
    what: 'a request decided by Redis again',
  });

describe('Redis paused, then killed and restarted, under steady traffic', () => {
  let server: RedisServer;
  let app: INestApplication;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => unhandled.push(reason);

  beforeAll(async () => {
    process.on('unhandledRejection', onUnhandled);
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [SteadyController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix(), storeErrors: { timeoutMs: 50 } },
    });
  });

  afterAll(async () => {
    process.off('unhandledRejection', onUnhandled);
    process.kill(server.pid, 'SIGCONT');
    await app?.close();
    await server?.stop();
  });

  it('never fails or hangs a request, decides by policy while Redis is out, and returns to Redis', async () => {
    const before = await steadyTraffic(app, 300);
    expect(before.every((s) => s.status === 200 && s.fromRedis)).toBe(true);

    process.kill(server.pid, 'SIGSTOP');
    const paused = await steadyTraffic(app, 3_000);
    process.kill(server.pid, 'SIGCONT');
    expect(paused.length).toBeGreaterThan(50);
    expect(paused.filter((s) => s.status !== 200)).toEqual([]);
    // The local fallback decided (the limit is far off); no request waited on the paused server.
    expect(paused.filter((s) => !s.fromRedis).length).toBeGreaterThan(paused.length * 0.9);
    // Bounded: the first calls wait a second more for a late answer (Redis could be only slow),
    // then calls are decided at their deadline, and the circuit opens.
    expect(Math.max(...paused.map(latency))).toBeLessThan(2_000);
    // Open, or probing (half-open) at this instant.
    expect(app.get(RedisService).runner.circuitState).not.toBe('closed');

    // Back on Redis once the breaker's probe succeeds.
    await backOnRedis(app);

    const crashed = server;
    await crashed.kill();
    const restarting = steadyTraffic(app, 1_500);
    server = await startRedisServer([], crashed.port);
    await crashed.stop();
    const down = await restarting;
    expect(down.filter((s) => s.status !== 200)).toEqual([]);
    expect(Math.max(...down.map(latency))).toBeLessThan(1_000);
    await backOnRedis(app);
    expect(unhandled).toEqual([]);
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RateLimit, RedisService } from 'nest-rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller('steady')
class SteadyController {
  @Get()
  @RateLimit({ count: 1_000_000, window: '1m', by: 'global' })
  get() {
    return {};
  }
}

interface Sample {
  status: number;
  ms: number;
  /** Redis decided (the headers are only sent for store decisions). */
  fromRedis: boolean;
}

/** Steady traffic from 4 sequential clients, for `durationMs` of real time (bounded in count too). */
async function steadyTraffic(app: INestApplication, durationMs: number): Promise<Sample[]> {
  const samples: Sample[] = [];
  const until = performance.now() + durationMs;
  const client = async () => {
    for (let i = 0; i < 2_000 && performance.now() < until; i += 1) {
      const started = performance.now();
      const response = await request(app.getHttpServer()).get('/steady');
      samples.push({
        status: response.status,
        ms: performance.now() - started,
        fromRedis: response.headers['ratelimit-limit'] !== undefined,
      });
    }
  };
  await Promise.all([client(), client(), client(), client()]);
  return samples;
}

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
    expect(Math.max(...paused.map((s) => s.ms))).toBeLessThan(1_000);
    // Open, or probing (half-open) at this instant.
    expect(app.get(RedisService).circuitState).not.toBe('closed');

    // Back on Redis once the breaker's probe succeeds.
    await vi.waitUntil(async () => (await steadyTraffic(app, 50)).some((s) => s.fromRedis), {
      timeout: 5_000,
      interval: 100,
    });

    const crashed = server;
    await crashed.kill();
    const restarting = steadyTraffic(app, 1_500);
    server = await startRedisServer([], crashed.port);
    await crashed.stop();
    const down = await restarting;
    expect(down.filter((s) => s.status !== 200)).toEqual([]);
    expect(Math.max(...down.map((s) => s.ms))).toBeLessThan(1_000);
    await vi.waitUntil(async () => (await steadyTraffic(app, 50)).some((s) => s.fromRedis), {
      timeout: 5_000,
      interval: 100,
    });
    expect(unhandled).toEqual([]);
  });
});

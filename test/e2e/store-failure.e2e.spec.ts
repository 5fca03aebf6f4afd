import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { rateLimitKey } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller('guarded')
class GuardedController {
  @Get()
  @RateLimit({ count: 100, window: '1m' })
  get() {
    return { ok: true };
  }
}

describe('when Redis stops answering, requests are decided by the store-error policy within the deadline', () => {
  let server: RedisServer;
  const logs = new LogCapture();
  let allowApp: INestApplication;
  let denyApp: INestApplication;
  const prefix = uniquePrefix();

  beforeAll(async () => {
    server = await startRedisServer();
    // The deadline alone: the circuit breaker has its own suite.
    const storeErrors = { timeoutMs: 50, circuitBreaker: false as const };
    const common = { redis: server.url, keyPrefix: prefix };
    // Both apps log to the capture: Nest's logger is process-wide.
    allowApp = await createTestApp({
      controllers: [GuardedController],
      rateLimit: { ...common, storeErrors: { ...storeErrors, policy: 'allow' } },
      logger: logs,
    });
    denyApp = await createTestApp({
      controllers: [GuardedController],
      rateLimit: { ...common, storeErrors: { ...storeErrors, policy: 'deny' } },
      logger: logs,
    });
  });

  afterAll(async () => {
    process.kill(server.pid, 'SIGCONT');
    await allowApp?.close();
    await denyApp?.close();
    await server?.stop();
  });

  it('admits (allow) or refuses with 429 and Retry-After (deny) while Redis is paused, then uses Redis again', async () => {
    await request(allowApp.getHttpServer()).get('/guarded').expect(200).expect('ratelimit-remaining', '99');

    process.kill(server.pid, 'SIGSTOP');
    const slowest = { ms: 0 };
    const timed = async <T>(call: () => Promise<T>): Promise<T> => {
      const started = performance.now();
      const result = await call();
      slowest.ms = Math.max(slowest.ms, performance.now() - started);
      return result;
    };
    try {
      for (let i = 0; i < 5; i += 1) {
        const allowed = await timed(() => request(allowApp.getHttpServer()).get('/guarded').expect(200));
        expect(allowed.headers['ratelimit-limit']).toBeUndefined();
        const denied = await timed(() => request(denyApp.getHttpServer()).get('/guarded').expect(429));
        expect(denied.headers['retry-after']).toBe('1');
        expect(denied.body).toMatchObject({ statusCode: 429, retryAfter: 1 });
      }
    } finally {
      process.kill(server.pid, 'SIGCONT');
    }
    // Not a speed measurement: a request that waited on the paused Redis would take seconds. The
    // first waits a second more for a late answer (Redis could be only slow), then Redis seems down.
    expect(slowest.ms).toBeLessThan(2_000);
    // Ten failures, one sampled line per app.
    const failures = logs.at(
      'error',
      /^Rate-limit store failed \(RedisTimeoutError: Redis did not answer consume within 50 ms\)/,
    );
    expect(failures).toEqual([
      expect.stringContaining("requests decided by the store-error policy 'allow': 1 since last report"),
      expect.stringContaining("requests decided by the store-error policy 'deny': 1 since last report"),
    ]);

    // The timed-out calls were sent, so Redis still runs them when it wakes up (1 + 5 + 5), each
    // exactly once; wait for all of them to land, then the next request is the 12th.
    const redis = server.client();
    // One client, supertest's: the rule counts by its address.
    const key = rateLimitKey(prefix, 'GuardedController.get', '127.0.0.1', 'fixed-window');
    await until(async () => (await fixedWindowCount(redis, key)) === 11, {
      timeoutMs: 5_000,
      intervalMs: 20,
      what: `a count of 11 at ${key}`,
    });
    await request(allowApp.getHttpServer()).get('/guarded').expect(200).expect('ratelimit-remaining', '88');
  });
});

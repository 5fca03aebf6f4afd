import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type RateLimitStore, type RedisService, keysBeside } from 'nest-rate-limit/store';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { until } from '../support/poll.js';
import { uniquePrefix } from '../support/test-app.js';

/** Keeps this process's event loop busy, as a CPU-bound handler or a long GC pause would. */
function stallEventLoop(ms: number): void {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    // spin
  }
}

const outcomeOf = (call: Promise<unknown>): Promise<string> =>
  call.then(
    () => 'answered',
    (error: Error) => error.constructor.name,
  );

describe('the Redis deadline measures Redis, not the event loop', () => {
  let server: RedisServer;
  let store: RateLimitStore;
  let redis: RedisService;
  let close: () => Promise<void>;
  const prefix = uniquePrefix();

  beforeAll(async () => {
    server = await startRedisServer();
    ({ store, redis, close } = await createStore({ redis: server.url, storeErrors: { timeoutMs: 100 } }));
  });

  afterEach(() => process.kill(server.pid, 'SIGCONT'));

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  it('takes replies that arrived while the loop was stalled past the deadline, and keeps the circuit closed', async () => {
    for (let round = 0; round < 10; round += 1) {
      const calls = Array.from({ length: 50 }, (_, i) =>
        outcomeOf(store.consume([hit(`${prefix}:{s${round}-${i}}:r:fw`, { limit: 5, windowMs: 60_000 })])),
      );
      // The calls are written to the socket; their replies arrive within microseconds, but nothing
      // reads them until the stall is over, three deadlines later.
      stallEventLoop(300);
      expect(await Promise.all(calls)).toEqual(Array.from({ length: 50 }, () => 'answered'));
    }
    expect(redis.runner.circuitState).toBe('closed');
  });

  it('still times out a Redis that does not answer, stalled loop or not', async () => {
    process.kill(server.pid, 'SIGSTOP');
    const idle = outcomeOf(store.consume([hit(`${prefix}:{p1}:r:fw`, { limit: 5, windowMs: 60_000 })]));
    expect(await idle).toBe('RedisTimeoutError');
    const stalled = outcomeOf(store.consume([hit(`${prefix}:{p2}:r:fw`, { limit: 5, windowMs: 60_000 })]));
    stallEventLoop(300);
    expect(await stalled).toBe('RedisTimeoutError');
  });

  it('ends what a call admitted past its deadline holds in flight: nobody else will settle it', async () => {
    const claim = hit(`${prefix}:{late}:r:fw`, { limit: 100, windowMs: 60_000, cost: 10, overdraftBound: 40 });
    const units = hit(`${prefix}:{late}:c:fw`, { limit: 100, windowMs: 60_000, conditional: true });
    const { pendingKey: claims } = keysBeside(claim.key);
    const { pendingKey: inFlight } = keysBeside(units.key);
    process.kill(server.pid, 'SIGSTOP');
    expect(await outcomeOf(store.consume([claim]))).toBe('RedisTimeoutError');
    expect(await outcomeOf(store.consume([units]))).toBe('RedisTimeoutError');
    process.kill(server.pid, 'SIGCONT');
    // Redis runs both once it is back, admits them, and each answer, late, ends its own.
    await until(async () => (await redis.client.exists(units.key)) === 1, { timeoutMs: 2_000, what: 'the late calls' });
    await until(async () => (await redis.client.zcard(claims)) + (await redis.client.zcard(inFlight)) === 0, {
      timeoutMs: 2_000,
      what: 'the late admissions ending in flight',
    });
    // Their units stay counted.
    const [standing] = await store.inspect([claim]);
    expect(standing.remaining).toBe(90);
  });
});

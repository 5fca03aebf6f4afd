import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { type RateLimitStore, type RedisService } from 'nest-rate-limit/store';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
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
    expect(redis.circuitState).toBe('closed');
  });

  it('still times out a Redis that does not answer, stalled loop or not', async () => {
    process.kill(server.pid, 'SIGSTOP');
    const idle = outcomeOf(store.consume([hit(`${prefix}:{p1}:r:fw`, { limit: 5, windowMs: 60_000 })]));
    expect(await idle).toBe('RedisTimeoutError');
    const stalled = outcomeOf(store.consume([hit(`${prefix}:{p2}:r:fw`, { limit: 5, windowMs: 60_000 })]));
    stallEventLoop(300);
    expect(await stalled).toBe('RedisTimeoutError');
  });
});

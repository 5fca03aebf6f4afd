import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/*
 * The local fallback decides from what Redis last reported of each key. It remembers the last
 * report of at least 100,000 keys, whatever `memoryStore.maxKeys` (the embedded store's bound) says:
 * a smaller memory, overrun by the keys of a busy minute, evicted on every request (a cost on each
 * decision), and forgot how much of its window a key had used, so an outage handed it a fresh share.
 */
describe('the local fallback remembers more keys than memoryStore.maxKeys', () => {
  let server: RedisServer;
  let store: Awaited<ReturnType<typeof createStore>>;
  const rule = { name: 'remembered', count: 10, window: '1m' } as const;

  beforeAll(async () => {
    server = await startRedisServer();
    store = await createStore({
      redis: server.url,
      keyPrefix: uniquePrefix(),
      memoryStore: { maxKeys: 5 },
      storeErrors: { timeoutMs: 50, circuitBreaker: false },
    });
    await until(() => store.redis.news.instances === 1, { timeoutMs: 5_000, what: 'the instance counted' });
  });

  afterAll(async () => {
    process.kill(server.pid, 'SIGCONT');
    await store?.close();
    await server?.stop();
  });

  it('decides a key from its last report after 50 other keys, in an outage', async () => {
    const admitted = async (identity: string, n: number) => {
      const outcomes = [];
      for (let i = 0; i < n; i += 1) outcomes.push((await store.limiter.consume(rule, identity)).allowed);
      return outcomes.filter(Boolean).length;
    };
    expect(await admitted('first', 6)).toBe(6);
    for (let i = 0; i < 50; i += 1) expect(await admitted(`other-${i}`, 1)).toBe(1);

    process.kill(server.pid, 'SIGSTOP');
    // One instance, 6 of 10 used when Redis last answered: 4 more. Forgotten, it would get 10.
    expect(await admitted('first', 8)).toBe(4);
  });
});

import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisSentinelSet, startRedisSentinelSet } from '../support/redis-server.js';
import { fixedWindowCount, plantFixedWindow } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import { failOver, untilCountedOn } from '../support/sentinel-failover.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

describe('through Redis Sentinel', () => {
  let set: RedisSentinelSet;

  beforeAll(async () => {
    set = await startRedisSentinelSet();
  });

  afterAll(() => set?.stop());

  it('with waitForReplicas, answers only once a replica has the counts', async () => {
    const logs = new LogCapture();
    const { store, close } = await createStore(
      {
        redis: { sentinels: set.sentinelAddresses, name: set.name },
        storeErrors: { timeoutMs: 1_000 },
        failover: { waitForReplicas: { replicas: 1, timeoutMs: 500 } },
      },
      logs,
    );
    const key = `${uniquePrefix()}:{w}:r:fw`;
    const replica = set.replica.client();
    try {
      for (let i = 1; i <= 5; i += 1) {
        const result = await store.consume([hit(key, { limit: 100, windowMs: 600_000 })]);
        expect(result.allowed).toBe(true);
        // Read from the replica at once: WAIT returned only after it had the write.
        expect(await fixedWindowCount(replica, key)).toBe(i);
      }
      // And every WAIT saw its replica: no shortfall was reported.
      expect(logs.at('error', /replicas/)).toEqual([]);
    } finally {
      await close();
    }
  });

  it('the lost-write check is on by default behind Sentinel, and catches a count lowered behind its back', async () => {
    const logs = new LogCapture();
    const { store, close } = await createStore(
      { redis: { sentinels: set.sentinelAddresses, name: set.name }, storeErrors: { timeoutMs: 1_000 } },
      logs,
    );
    const key = `${uniquePrefix()}:{l}:r:fw`;
    const limits = { limit: 20, windowMs: 600_000 };
    const master = set.master.client();
    try {
      expect(logs.at('log', /^Lost-write check on: Redis Sentinel/)).toHaveLength(1);
      for (let i = 0; i < 10; i += 1) expect((await store.consume([hit(key, limits)])).allowed).toBe(true);
      // A failover to a replica that lacked the last 8 writes, as the master now reports it.
      await plantFixedWindow(master, key, { count: 2 });
      const next = await store.consume([hit(key, limits)]);
      expect(next.decisions[0]).toMatchObject({ allowed: true, remaining: 9 });
      expect(await fixedWindowCount(master, key)).toBe(11);
    } finally {
      await close();
    }
  });

  it('counts on the master the sentinels name, and follows it after a failover', async () => {
    const { store, redis, close } = await createStore({
      redis: { sentinels: set.sentinelAddresses, name: set.name },
      storeErrors: { timeoutMs: 1_000 },
    });
    const key = `${uniquePrefix()}:{s}:r:fw`;
    const limits = { limit: 100, windowMs: 600_000 };
    try {
      expect(redis.describe()).toContain(`sentinels`);
      await store.consume([hit(key, limits)]);
      const master: Redis = set.master.client();
      expect(await fixedWindowCount(master, key)).toBe(1);
      // This test is about following the master, not about lost writes: let the write replicate.
      expect(await master.call('WAIT', '1', '5000')).toBe(1);

      // Sentinel promotes the replica (it has every write: see WAIT above); the client follows.
      const replica = await failOver(set);
      await untilCountedOn(replica, key, 2, () => store.consume([hit(key, limits)]));
      expect(redis.client.status).toBe('ready');
    } finally {
      await close();
    }
  });
});

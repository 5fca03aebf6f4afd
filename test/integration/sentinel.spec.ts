import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisSentinelSet, type RedisServer, startRedisSentinelSet } from '../support/redis-server.js';
import { fixedWindowCount, plantFixedWindow } from '../support/inspect.js';
import { until } from '../support/poll.js';
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

  it('on the promoted master, stays there when a sentinel announces the switch late: no reconnect, no call failed', async () => {
    const { store, redis, close } = await createStore({
      redis: { sentinels: set.sentinelAddresses, name: set.name },
      storeErrors: { timeoutMs: 1_000 },
    });
    const key = `${uniquePrefix()}:{a}:r:fw`;
    const limits = { limit: 100_000, windowMs: 600_000 };
    const client = redis.client as Redis;
    const announced = (sentinel: RedisServer) => {
      const subscriber = sentinel.client();
      const heard = new Promise<string>((resolve) =>
        subscriber.once('message', (_channel, message: string) => resolve(message)),
      );
      return subscriber.subscribe('+switch-master').then(() => heard);
    };
    try {
      await store.consume([hit(key, limits)]);
      // Whichever server an earlier test left master; the other is promoted.
      const [from, to] =
        client.stream.remotePort === set.master.port ? [set.master, set.replica] : [set.replica, set.master];
      // A replica to promote. One an earlier failover demoted is turned into the new master's
      // replica at the sentinels' next look (10 s; more on a busy machine): done here at once, as
      // they would do it.
      await to.client().call('REPLICAOF', '127.0.0.1', String(from.port));
      const master = from.client();
      await until(async () => (await master.call('WAIT', '1', '1000')) === 1, {
        timeoutMs: 30_000,
        what: 'the replica confirming the writes',
      });
      const switched = Promise.all(set.sentinels.map(announced));
      await set.sentinels[0].client().call('SENTINEL', 'FAILOVER', set.name);
      await switched;
      await until(() => client.status === 'ready' && client.stream.remotePort === to.port, {
        timeoutMs: 15_000,
        intervalMs: 10,
        what: 'the client following the sentinels to the promoted master',
      });

      // A sentinel that missed the failover (here: made to forget it, and to name the old master
      // again) learns it from the others' hellos within 2 s, and announces it then: as in a real
      // failover, a sentinel announcing the switch after the client reached the new master.
      const late = set.sentinels[2];
      const lateSwitch = announced(late);
      await late.client().call('SENTINEL', 'REMOVE', set.name);
      await late.client().call('SENTINEL', 'MONITOR', set.name, '127.0.0.1', String(from.port), '2');
      let reconnects = 0;
      client.on('close', () => (reconnects += 1));
      const failed: string[] = [];
      let calling = true;
      const calls = (async () => {
        // Bounded: 10 s of calls at most, should the announcement not come.
        for (let i = 0; calling && i < 1_000; i += 1) {
          await store.consume([hit(key, limits)]).catch((error: Error) => failed.push(error.message));
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      })();
      expect(await lateSwitch).toBe(`${set.name} 127.0.0.1 ${from.port} 127.0.0.1 ${to.port}`);
      // The announcement reaches the client's subscriptions as it reaches the test's: half a second
      // more for a reconnect it would set off (nothing tells of one not happening).
      await new Promise((resolve) => setTimeout(resolve, 500));
      calling = false;
      await calls;
      expect({ reconnects, failed }).toEqual({ reconnects: 0, failed: [] });
    } finally {
      await close();
    }
    // Seconds more on a busy machine: an earlier test's demoted master attaches as a replica only at
    // the sentinels' next look (10 s), and the late sentinel hears the others every 2 s.
  }, 60_000);
});

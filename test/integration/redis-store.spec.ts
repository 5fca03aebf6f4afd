import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitStore } from 'nest-rate-limit/store';
import { fixedWindowCount, plantFixedWindow, redisNow } from '../support/inspect.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

describe('Redis store (consume script) against a real Redis', () => {
  let server: RedisServer;
  let redis: Redis;
  let store: RateLimitStore;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    ({ store, close } = await createStore({ redis: server.url, storeErrors: { timeoutMs: 1_000 } }));
  });

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  async function keysWithoutTtl(pattern: string): Promise<string[]> {
    const keys = await redis.keys(pattern);
    const ttls = await Promise.all(keys.map((key) => redis.pttl(key)));
    return keys.filter((_, i) => ttls[i] === -1);
  }

  it('never leaves a key without a TTL when requests arrive as the key expires', async () => {
    const prefix = uniquePrefix();
    const admitted: number[] = [];
    for (let round = 0; round < 100; round += 1) {
      // A key of the library's layout (`…:rule:algorithm`), so each round's marker is its own.
      const key = `${prefix}:{edge}:r${round}:fw`;
      // Near the limit, its window ending (and the key expiring) in 3 ms: some hits land before, some after.
      await plantFixedWindow(redis, key, { start: (await redisNow(redis)) - 60_000 + 3, count: 2 });
      await redis.pexpire(key, 3);
      const decisions = await Promise.all(
        Array.from(
          { length: 8 },
          (_, i) =>
            new Promise<boolean>((resolve, reject) => {
              setTimeout(
                () => store.consume([hit(key, { limit: 3, windowMs: 60_000 })]).then((d) => resolve(d.allowed), reject),
                i,
              );
            }),
        ),
      );
      admitted.push(decisions.filter(Boolean).length);
      expect(await redis.pttl(key), `round ${round}`).toBeGreaterThan(0);
      // The key may expire between the two reads: no count then, which is within the limit too.
      expect((await fixedWindowCount(redis, key)) ?? 0).toBeLessThanOrEqual(3);
    }
    expect(await keysWithoutTtl(`${prefix}:*`)).toEqual([]);
    // Rounds reached a new window (more than the one slot left in the old one was admitted).
    expect(admitted.some((n) => n > 1)).toBe(true);
  });

  it('repairs a key left without a TTL on the next request, admitted or not', async () => {
    const prefix = uniquePrefix();
    const now = await redisNow(redis);
    await plantFixedWindow(redis, `${prefix}:over`, { start: now, count: 7 });
    await plantFixedWindow(redis, `${prefix}:under`, { start: now, count: 1 });
    expect(await keysWithoutTtl(`${prefix}:*`)).toHaveLength(2);

    const over = await store.consume([hit(`${prefix}:over`, { limit: 3, windowMs: 5_000 })]);
    const under = await store.consume([hit(`${prefix}:under`, { limit: 3, windowMs: 5_000 })]);

    expect(over.decisions[0]).toMatchObject({ allowed: false, remaining: 0 });
    expect(under.decisions[0]).toMatchObject({ allowed: true, remaining: 1 });
    expect(await keysWithoutTtl(`${prefix}:*`)).toEqual([]);
    expect(await fixedWindowCount(redis, `${prefix}:over`)).toBe(7);
    expect(await fixedWindowCount(redis, `${prefix}:under`)).toBe(2);
  });

  it('keeps a concurrency cap in one sorted set with a TTL of its lease, taken, refused, renewed or given back', async () => {
    const prefix = uniquePrefix();
    const lease = 30_000;
    const cap = hit(`${prefix}:{cap}:exports:sl`, { algorithm: 'sliding-log', limit: 2, windowMs: lease, slot: true });
    const ttlHeld = async () => {
      const keys = await redis.keys(`${prefix}:*`);
      const ttls = await Promise.all(keys.map((key) => redis.pttl(key)));
      return { keys, ttls };
    };
    const taken = [await store.consume([cap]), await store.consume([cap])];
    expect(taken.map(({ allowed }) => allowed)).toEqual([true, true]);
    expect((await store.consume([cap])).allowed).toBe(false);
    const held = await ttlHeld();
    expect(held.keys).toEqual([cap.key]);
    expect(await redis.type(cap.key)).toBe('zset');
    // The lease, and a second of grace at most.
    for (const ttl of held.ttls) expect(ttl > 0 && ttl <= lease + 1_000).toBe(true);
    const slots = taken.map((consumption) => ({ hit: cap, receipt: consumption.receipts![0] }));
    await store.renewSlots(slots);
    for (const ttl of (await ttlHeld()).ttls) expect(ttl > 0 && ttl <= lease + 1_000).toBe(true);
    await store.settle(slots.map((slot) => ({ ...slot, refund: true })));
    expect(await keysWithoutTtl(`${prefix}:*`)).toEqual([]);
    expect(await redis.zcard(cap.key)).toBe(0);
  });

  it('keeps counting correctly after SCRIPT FLUSH, re-sending the script on NOSCRIPT', async () => {
    const key = `${uniquePrefix()}:flush`;
    await redis.config('RESETSTAT');
    const results = [];
    for (let i = 0; i < 4; i += 1) {
      await redis.script('FLUSH');
      results.push((await store.consume([hit(key, { limit: 3, windowMs: 60_000 })])).decisions[0]);
    }
    expect(results.map((r) => r.allowed)).toEqual([true, true, true, false]);
    expect(results.map((r) => r.remaining)).toEqual([2, 1, 0, 0]);
    expect(await fixedWindowCount(redis, key)).toBe(3);
    // Every EVALSHA after a flush met NOSCRIPT and was answered by an EVAL.
    expect(commandCalls(await redis.info('commandstats'), 'eval')).toBe(4);
  });

  it('reports the window left as resetMs, and takes a shorter window at once', async () => {
    // The caller's clock (the module's `clock` option) instead of Redis TIME.
    let now = 1_000_000;
    const key = `${uniquePrefix()}:reset`;
    const hour = hit(key, { limit: 1, windowMs: 3_600_000 });
    expect((await store.consume([hour], now)).decisions[0]).toEqual({
      allowed: true,
      limit: 1,
      remaining: 0,
      resetMs: 3_600_000,
    });
    now += 1_000;
    expect((await store.consume([hour], now)).decisions[0]).toMatchObject({ allowed: false, resetMs: 3_599_000 });
    // The window shrank to 1 s (a config-centre change): the window that began 1 s ago is over.
    const second = hit(key, { limit: 1, windowMs: 1_000 });
    expect((await store.consume([second], now)).decisions[0]).toMatchObject({ allowed: true, resetMs: 1_000 });
    expect(await redis.pttl(key)).toBeLessThanOrEqual(2_000);
  });
});

function commandCalls(info: string, command: string): number {
  const match = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info);
  return match ? Number(match[1]) : 0;
}

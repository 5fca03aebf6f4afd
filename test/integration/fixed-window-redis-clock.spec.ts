import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RateLimitHit, type RateLimitStore, STORED_FIELDS, keysBeside } from 'nest-rate-limit/store';
import { fixedWindowCount, redisNow } from '../support/inspect.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/**
 * A fixed window on Redis's clock (no `clock` option): an integer whose TTL is the window. Every
 * case runs for the rule alone (the lean script most requests take) and beside a rule of another
 * algorithm (the general script), which must keep the same state the same way.
 */
const SHAPES = {
  alone: (fixed: RateLimitHit): RateLimitHit[] => [fixed],
  'beside another algorithm': (fixed: RateLimitHit): RateLimitHit[] => [
    fixed,
    hit(fixed.key.replace(/:fw$/, ':sl'), { limit: 1_000, windowMs: 60_000, algorithm: 'sliding-log' }),
  ],
};

const FIXED_WINDOW = STORED_FIELDS['fixed-window'];

describe('fixed windows on Redis’s clock: an integer timed by its TTL', () => {
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

  describe.each(Object.entries(SHAPES))('%s', (_, shape) => {
    const key = () => `${uniquePrefix()}:{alice}:rule:fw`;

    it('keeps one integer per window, its TTL the window, and reports that TTL as the reset', async () => {
      const k = key();
      const fixed = hit(k, { limit: 10, windowMs: 60_000 });
      for (let i = 0; i < 3; i += 1) expect((await store.consume(shape(fixed))).allowed).toBe(true);
      expect(await redis.type(k)).toBe('string');
      expect(await redis.get(k)).toBe('3');
      const ttl = await redis.pttl(k);
      expect(ttl).toBeGreaterThan(50_000);
      expect(ttl).toBeLessThanOrEqual(60_000);
      const next = (await store.consume(shape(fixed))).decisions[0];
      expect(next).toMatchObject({ allowed: true, remaining: 6 });
      expect(next.resetMs).toBeLessThanOrEqual(ttl);
      expect(next.resetMs).toBeGreaterThan(ttl - 5_000);
      // No marker (failover.marker is off by default), and nothing else beside the counter.
      expect(await redis.exists(keysBeside(k).markerKey)).toBe(0);
    });

    it('refuses past the limit without moving the counter, and a refusal starts no window', async () => {
      const k = key();
      const fixed = hit(k, { limit: 2, windowMs: 60_000 });
      expect((await store.consume(shape(fixed))).allowed).toBe(true);
      expect((await store.consume(shape(fixed))).allowed).toBe(true);
      const refused = await store.consume(shape(fixed));
      expect(refused.allowed).toBe(false);
      expect(refused.decisions[0]).toMatchObject({ allowed: false, remaining: 0 });
      expect(await redis.get(k)).toBe('2');

      const fresh = key();
      const tooDear = await store.consume(shape(hit(fresh, { limit: 2, windowMs: 60_000, cost: 3 })));
      expect(tooDear.allowed).toBe(false);
      expect(await redis.exists(fresh)).toBe(0);
    });

    it('starts a new window once the key expires', async () => {
      const k = key();
      const fixed = hit(k, { limit: 1, windowMs: 60_000 });
      expect((await store.consume(shape(fixed))).allowed).toBe(true);
      expect((await store.consume(shape(fixed))).allowed).toBe(false);
      await redis.pexpire(k, 1);
      await until(async () => (await redis.exists(k)) === 0, {
        timeoutMs: 2_000,
        intervalMs: 5,
        what: `${k} expiring`,
      });
      const again = (await store.consume(shape(fixed))).decisions[0];
      expect(again).toMatchObject({ allowed: true, remaining: 0 });
      expect(again.resetMs).toBeGreaterThan(59_000);
    });

    it('gives a counter found without a TTL a window at most, so it never bans for ever', async () => {
      const k = key();
      await redis.set(k, 10);
      const refused = await store.consume(shape(hit(k, { limit: 5, windowMs: 30_000 })));
      expect(refused.allowed).toBe(false);
      const ttl = await redis.pttl(k);
      expect(ttl).toBeGreaterThan(0);
      expect(ttl).toBeLessThanOrEqual(30_000);
      expect(await redis.get(k)).toBe('10');
    });

    it('keeps a window an earlier version stored as a hash, for what is left of it', async () => {
      const k = key();
      const start = (await redisNow(redis)) - 20_000;
      await redis.hset(k, FIXED_WINDOW.start, start, FIXED_WINDOW.count, 4);
      await redis.pexpire(k, 41_000);
      const decision = (await store.consume(shape(hit(k, { limit: 5, windowMs: 60_000 })))).decisions[0];
      expect(decision).toMatchObject({ allowed: true, remaining: 0 });
      expect(await redis.type(k)).toBe('string');
      expect(await redis.get(k)).toBe('5');
      const ttl = await redis.pttl(k);
      expect(ttl).toBeGreaterThan(35_000);
      expect(ttl).toBeLessThanOrEqual(40_000);
      expect((await store.consume(shape(hit(k, { limit: 5, windowMs: 60_000 })))).allowed).toBe(false);
    });

    it('takes junk at the key for no window: counts afresh', async () => {
      for (const junk of ['abc', '1.5', '-3']) {
        const k = key();
        await redis.set(k, junk, 'PX', 60_000);
        const decision = (await store.consume(shape(hit(k, { limit: 5, windowMs: 60_000 })))).decisions[0];
        expect(decision, junk).toMatchObject({ allowed: true, remaining: 4 });
        expect(await fixedWindowCount(redis, k), junk).toBe(1);
      }
    });

    it('refunds into the admission’s window only, never into one begun since', async () => {
      const k = key();
      const fixed = hit(k, { limit: 5, windowMs: 60_000 });
      const first = await store.consume(shape(fixed));
      const second = await store.consume(shape(fixed));
      await store.refund([{ hit: fixed, receipt: second.receipts![0] }]);
      expect(await redis.get(k)).toBe('1');
      // A new window with one admission (after a reset), begun 50 s before the first one.
      await store.reset([k]);
      await store.consume(shape(fixed));
      await redis.pexpire(k, 10_000);
      await store.refund([{ hit: fixed, receipt: first.receipts![0] }]);
      expect(await redis.get(k)).toBe('1');
    });
  });

  // Redis's clock moves while a script runs (a long call, or Redis descheduled on a busy machine):
  // a window's start must be the time its end was reckoned from, never a second reading of the
  // clock. 2,000 rules keep one call running for milliseconds between its first and last window.
  it.each(Object.entries(SHAPES))(
    'refunds every rule of a long call into its own window (%s), however far the clock moves meanwhile',
    async (_, shape) => {
      const prefix = uniquePrefix();
      const fixed = Array.from({ length: 2_000 }, (_, i) =>
        hit(`${prefix}:{carol}:r${i}:fw`, { limit: 5, windowMs: 60_000 }),
      );
      const hits = fixed.flatMap((rule, i) => (i === 0 ? shape(rule) : [rule]));
      const admitted = await store.consume(hits);
      expect(admitted.allowed).toBe(true);
      await store.refund(hits.map((rule, i) => ({ hit: rule, receipt: admitted.receipts![i] })));
      const counts = await redis.mget(...fixed.map((rule) => rule.key));
      expect(counts.filter((count) => count !== '0').length, 'counters a refund missed').toBe(0);
    },
  );

  it.each(Object.entries(SHAPES))(
    'with failover.marker, the marker (written from the first unit of a limit of 1) ends with its counter (%s)',
    async (_, shape) => {
      const marking = await createStore({
        redis: server.url,
        storeErrors: { timeoutMs: 1_000 },
        failover: { marker: 0.8 },
      });
      try {
        const k = `${uniquePrefix()}:{dave}:rule:fw`;
        const fixed = hit(k, { limit: 1, windowMs: 60_000 });
        expect((await marking.store.consume(shape(fixed))).allowed).toBe(true);
        expect((await marking.store.consume(shape(fixed))).allowed).toBe(false);
        const { markerKey } = keysBeside(k);
        expect(await redis.get(markerKey)).toBe('1');
        expect(await redis.pexpiretime(markerKey)).toBe(await redis.pexpiretime(k));
      } finally {
        await marking.close();
      }
    },
  );

  it('decides several fixed windows together: all admit and count, or none counts', async () => {
    const prefix = uniquePrefix();
    const wide = hit(`${prefix}:{bob}:wide:fw`, { limit: 10, windowMs: 60_000 });
    const narrow = hit(`${prefix}:{bob}:narrow:fw`, { limit: 1, windowMs: 60_000 });
    expect((await store.consume([wide, narrow])).allowed).toBe(true);
    const refused = await store.consume([wide, narrow]);
    expect(refused.allowed).toBe(false);
    expect(refused.decisions.map((decision) => decision.allowed)).toEqual([true, false]);
    expect(await redis.get(wide.key)).toBe('1');
    expect(await redis.get(narrow.key)).toBe('1');
  });
});

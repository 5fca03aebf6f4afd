import { describe, expect, it } from 'vitest';
import { type RateLimitModuleOptions, type RateLimiterService } from 'nest-rate-limit';
import { type RateLimitHit, type RateLimitStore, rateLimitKey } from 'nest-rate-limit/store';
import { until } from '../support/poll.js';
import { scriptCalls, sharedRedisSuite } from '../support/shared-redis.js';
import { uniquePrefix } from '../support/test-app.js';

describe('the block cache: keys Redis refused are refused here until the reset it reported', () => {
  const suite = sharedRedisSuite();
  const built = (count: number, options: RateLimitModuleOptions = {}) => suite.instances(count, options);

  async function instances(count: number, options: RateLimitModuleOptions = {}): Promise<RateLimiterService[]> {
    return (await built(count, options)).limiters;
  }

  async function admitted(limiter: RateLimiterService, rule: Parameters<RateLimiterService['consume']>[0], n: number) {
    let count = 0;
    for (let i = 0; i < n; i += 1) if ((await limiter.consume(rule, 'mallory')).allowed) count += 1;
    return count;
  }

  const RULE = { name: 'login', count: 5, window: '1m' } as const;

  /** A fixed window's start on Redis's clock, as the store names it: its end less the window (1 min). */
  async function windowStart(key: string): Promise<number> {
    return Number(await suite.redis.call('PEXPIRETIME', key)) - 60_000;
  }

  it('answers an attack on one key with one Redis call per instance once the window is full, exactly', async () => {
    const [a, b] = await instances(2);
    await suite.redis.config('RESETSTAT');
    let total = 0;
    for (let i = 0; i < 500; i += 1) {
      if ((await a.consume(RULE, 'mallory')).allowed) total += 1;
      if ((await b.consume(RULE, 'mallory')).allowed) total += 1;
    }
    expect(total).toBe(5);
    // Five admissions, then each instance asks once more, learns the block and asks no more.
    expect(await scriptCalls(suite.redis)).toBe(7);
    const refused = await a.consume(RULE, 'mallory');
    expect(refused.allowed).toBe(false);
    expect(refused.reported).toMatchObject({ remaining: 0, limit: 5 });
    expect(refused.reported!.resetMs).toBeGreaterThan(50_000);
    expect(refused.reported!.resetMs).toBeLessThanOrEqual(60_000);
  });

  it('answers a concurrent burst on one key with about one Redis call per unit admitted, exactly', async () => {
    const [a, b] = await instances(2);
    await suite.redis.config('RESETSTAT');
    // Two instances, 1,000 decisions each, all in flight at once: none has an answer to learn from yet.
    const outcomes = await Promise.all(
      Array.from({ length: 2_000 }, (_, i) => (i % 2 === 0 ? a : b).consume(RULE, 'mallory')),
    );
    expect(outcomes.filter((outcome) => outcome.allowed)).toHaveLength(5);
    // Without holding calls of one key in flight, each of the 2,000 reached Redis. With it, each
    // instance sends at most the limit at once, then one call per unit it still believes is left,
    // and one that learns the refusal: at most 2 x (5 + 5 + 1).
    expect(await scriptCalls(suite.redis)).toBeLessThanOrEqual(22);
  });

  /** Counts the calls of the instance's store that are in flight together, at most. */
  function mostInFlight(store: RateLimitStore): () => number {
    const consume = store.consume.bind(store);
    let now = 0;
    let most = 0;
    store.consume = async (...args) => {
      most = Math.max(most, (now += 1));
      try {
        return await consume(...args);
      } finally {
        now -= 1;
      }
    };
    return () => most;
  }

  it('holds no call of keys far from their limit, nor of distinct keys', async () => {
    const {
      stores: [{ store, limiter }],
    } = await built(1);
    const most = mostInFlight(store);
    const wide = { name: 'wide', count: 1_000, window: '1m' } as const;
    const hot = Array.from({ length: 200 }, () => limiter.consume(wide, 'crowd'));
    const spread = Array.from({ length: 200 }, (_, i) => limiter.consume(RULE, `client-${i}`));
    const outcomes = await Promise.all([...hot, ...spread]);
    expect(outcomes.every((outcome) => outcome.allowed)).toBe(true);
    // Every call was sent before any answer came back: none waited for another.
    expect(most()).toBe(400);
  });

  it('asks Redis every time without it (blockCache: false)', async () => {
    const [a] = await instances(1, { blockCache: false });
    await suite.redis.config('RESETSTAT');
    expect(await admitted(a, RULE, 50)).toBe(5);
    expect(await scriptCalls(suite.redis)).toBe(50);
  });

  it('lifts the block on every instance when one resets the key', async () => {
    const [a, b] = await instances(2);
    expect(await admitted(a, RULE, 6)).toBe(5);
    expect(await admitted(b, RULE, 3)).toBe(0);
    await a.reset(RULE, 'mallory');
    // The reset reaches b over Redis pub/sub; until then b may still refuse from its cache.
    await until(async () => (await b.consume(RULE, 'mallory')).allowed, {
      timeoutMs: 2_000,
      intervalMs: 5,
      what: "the reset reaching the other instance's block cache",
    });
    expect(await admitted(a, RULE, 10)).toBe(4);
  });

  it('lifts the block on every instance when the store refunds the key', async () => {
    const { keyPrefix, stores } = await built(2);
    const [a, b] = stores.map(({ limiter }) => limiter);
    const rule = { name: 'refunded', count: 1, window: '1m' } as const;
    const first = await a.consume(rule, 'mallory');
    expect(first.allowed).toBe(true);
    expect(await admitted(b, rule, 2)).toBe(0);
    // The store takes the unit back, as it does for a Cluster slot after another slot refused.
    const key = rateLimitKey(keyPrefix, 'refunded', 'mallory', 'fixed-window');
    const hit: RateLimitHit = {
      key,
      algorithm: 'fixed-window',
      limit: 1,
      windowMs: 60_000,
      cost: 1,
      burst: 1,
      blockMs: 0,
      conditional: false,
    };
    await stores[0].store.refund([
      { hit, receipt: { admittedAt: 0, nonce: 'refund', windowStart: await windowStart(key) } },
    ]);
    expect(await suite.redis.get(key)).toBe('0');
    await until(async () => (await b.consume(rule, 'mallory')).allowed, {
      timeoutMs: 2_000,
      intervalMs: 5,
      what: "the refund reaching the other instance's block cache",
    });
  });

  it('asks Redis again when the limit changes, so a raised limit admits at once', async () => {
    const [a] = await instances(1);
    expect(await admitted(a, { name: 'quota', count: 2, window: '1m' }, 5)).toBe(2);
    expect(await admitted(a, { name: 'quota', count: 3, window: '1m' }, 5)).toBe(1);
  });

  it('asks Redis for a hit cheaper than the one refused, and keeps no refusal that left units', async () => {
    const [a] = await instances(1);
    const rule = { name: 'units', count: 5, window: '1m' } as const;
    expect((await a.consume(rule, 'mallory', 4)).allowed).toBe(true);
    expect((await a.consume(rule, 'mallory', 3)).allowed).toBe(false);
    expect((await a.consume(rule, 'mallory', 1)).allowed).toBe(true);
    expect((await a.consume(rule, 'mallory', 1)).allowed).toBe(false);
    // Full now and refused at cost 1: cost 0 still admits, as Redis would.
    expect((await a.consume(rule, 'mallory', 0)).allowed).toBe(true);
  });

  it('keeps no block for a countOn rule, whose units may be refunded', async () => {
    const [a] = await instances(1, { countOn: { inFlightWaitMs: 0 } });
    const rule = { name: 'upload', count: 1, window: '1m', countOn: 'success' } as const;
    const first = await a.consume(rule, 'mallory');
    expect(first.allowed).toBe(true);
    await suite.redis.config('RESETSTAT');
    expect((await a.consume(rule, 'mallory')).allowed).toBe(false);
    expect((await a.consume(rule, 'mallory')).allowed).toBe(false);
    expect(await scriptCalls(suite.redis)).toBe(2);
    await a.settle(first, false);
    expect((await a.consume(rule, 'mallory')).allowed).toBe(true);
  });

  it('ends a block no later than the window Redis reported', async () => {
    const keyPrefix = uniquePrefix();
    const [a] = await instances(1, { keyPrefix });
    const rule = { name: 'short', count: 1, window: 300 } as const;
    expect(await admitted(a, rule, 3)).toBe(1);
    const key = rateLimitKey(keyPrefix, 'short', 'mallory', 'fixed-window');
    await until(async () => (await suite.redis.exists(key)) === 0, {
      timeoutMs: 2_000,
      intervalMs: 5,
      what: `${key} expiring`,
    });
    expect((await a.consume(rule, 'mallory')).allowed).toBe(true);
  });
});

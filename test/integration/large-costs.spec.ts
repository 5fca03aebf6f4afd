import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitOptions } from 'nest-rate-limit';
import { type RateLimitAlgorithmName, type RateLimitStore, rateLimitKey } from 'nest-rate-limit/store';
import { STORES } from '../support/matrix.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/** The cap of windows, penalties and now of any wait a state holds: 365 days. */
const YEAR_MS = 365 * 86_400_000;
/** A key outlives what its state holds by a second (`GRACE_MS`). */
const GRACE_MS = 1_000;
const HUGE_COSTS = [1_000_000, 1e12, Number.MAX_SAFE_INTEGER];

/**
 * Costs far past any limit (a settled cost, a cost function gone wrong, a recorded outage) cost a
 * decision no more than a cost of 1: a sliding log writes one member per admission whatever its
 * cost, and a token bucket's or GCRA's wait stays within 365 days. Asserted by what Redis holds
 * after the call, and by Redis answering: no timing.
 */
describe.each(STORES)('large costs: $name store', (storeCase) => {
  let store: RateLimitStore;
  let limiter: Awaited<ReturnType<typeof createStore>>['limiter'];
  let close: () => Promise<void>;
  let redis: Redis | undefined;
  const prefix = uniquePrefix();
  const t0 = 1_800_000_000_000;

  beforeAll(async () => {
    const url = await storeCase.redis();
    ({ store, limiter, close } = await createStore({ redis: url, keyPrefix: prefix }));
    if (url) redis = new Redis(url);
  });

  afterAll(async () => {
    await close?.();
    await redis?.quit();
  });

  const key = (algorithm: RateLimitAlgorithmName) => `${uniquePrefix()}:{large}:${algorithm}`;

  /** On Redis: the sliding log holds at most `members` members in a few hundred bytes, and Redis answers. */
  async function expectSmallLog(logKey: string, members: number): Promise<void> {
    if (!redis) return;
    expect(await redis.zcard(logKey)).toBeLessThanOrEqual(members);
    expect(Number(await redis.memory('USAGE', logKey))).toBeLessThan(1_000);
    expect(await redis.ping()).toBe('PONG');
  }

  it.each(HUGE_COSTS)('a sliding log admits a cost of %d in one member', async (cost) => {
    const logKey = key('sliding-log');
    const rule = hit(logKey, { algorithm: 'sliding-log', limit: cost, windowMs: 60_000, cost });
    expect((await store.consume([rule], t0)).allowed).toBe(true);
    await expectSmallLog(logKey, 1);
    const next = await store.consume([{ ...rule, cost: 1 }], t0 + 1);
    expect(next.decisions[0]).toMatchObject({ allowed: false, remaining: 0, resetMs: 59_999 });
  });

  it.each(HUGE_COSTS)('a sliding log records a cost of %d past its limit in one member', async (cost) => {
    const logKey = key('sliding-log');
    const rule = hit(logKey, { algorithm: 'sliding-log', limit: 5, windowMs: 60_000 });
    await store.record([{ ...rule, cost }], t0);
    await expectSmallLog(logKey, 1);
    expect((await store.consume([rule], t0 + 1)).decisions[0]).toMatchObject({ allowed: false, resetMs: 59_999 });
    // Gone with its window, like any admission.
    expect((await store.consume([rule], t0 + 60_000)).decisions[0]).toMatchObject({ allowed: true, remaining: 4 });
  });

  it('a sliding log settles a cost of 1,000,000 in one member, and a refund takes part of one', async () => {
    const identity = uniquePrefix();
    const options = {
      name: 'completions',
      count: 5,
      window: '1m',
      algorithm: 'sliding-log' as const,
      cost: 4,
      settleCost: { actual: () => 0, max: 5 },
    } satisfies RateLimitOptions;
    const spent = await limiter.consume(options, identity, 4);
    await limiter.settleCost(spent, 1_000_000);
    // The reservation's member and the charge's.
    await expectSmallLog(rateLimitKey(prefix, 'completions', identity, 'sliding-log'), 2);
    expect((await limiter.consume(options, `${identity}-x`, 4)).allowed).toBe(true);
    expect((await limiter.consume(options, identity, 1)).allowed).toBe(false);

    // Settled for less: 3 of the 4 reserved come back, and the member holds 1.
    const other = `${identity}-less`;
    const reserved = await limiter.consume(options, other, 4);
    await limiter.settleCost(reserved, 1);
    await expectSmallLog(rateLimitKey(prefix, 'completions', other, 'sliding-log'), 1);
    expect((await limiter.consume(options, other, 4)).allowed).toBe(true);
    expect((await limiter.consume(options, other, 1)).allowed).toBe(false);
  });

  describe.each(['token-bucket', 'gcra'] as const)('%s', (algorithm) => {
    it.each(HUGE_COSTS)('a charge of %d makes the identity wait 365 days at most', async (cost) => {
      const stateKey = key(algorithm);
      const rule = hit(stateKey, { algorithm, limit: 10, windowMs: 60_000 });
      await store.record([{ ...rule, cost }], t0);
      if (redis) {
        const ttl = await redis.pttl(stateKey);
        expect(ttl).toBeGreaterThan(60_000);
        expect(ttl).toBeLessThanOrEqual(YEAR_MS + GRACE_MS);
      }
      const refused = await store.consume([rule], t0);
      expect(refused.decisions[0].allowed).toBe(false);
      expect(refused.decisions[0].resetMs).toBeGreaterThan(60_000);
      expect(refused.decisions[0].resetMs).toBeLessThanOrEqual(YEAR_MS);
      // A cost the bucket can never hold is refused, and told to wait no more than that either.
      const never = await store.consume([{ ...rule, cost }], t0);
      expect(never.decisions[0].resetMs).toBeLessThanOrEqual(YEAR_MS);
      if (redis) expect(await redis.pttl(stateKey)).toBeLessThanOrEqual(YEAR_MS + GRACE_MS);
    });
  });
});

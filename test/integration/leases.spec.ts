import { describe, expect, it } from 'vitest';
import { type RateLimitRuleRef, type RateLimiterService } from 'nest-rate-limit';
import { RateLimitConfigCentre, type RateLimitOverride } from 'nest-rate-limit/live';
import { rateLimitKey } from 'nest-rate-limit/store';
import { until } from '../support/poll.js';
import { startRedisServer } from '../support/redis-server.js';
import { scriptCalls, sharedRedisSuite } from '../support/shared-redis.js';
import { createStore } from '../support/store-module.js';

/** Admissions of `n` decisions on one instance, `inFlight` at a time. */
async function admitted(limiter: RateLimiterService, rule: RateLimitRuleRef, n: number, inFlight = 1) {
  let count = 0;
  for (let sent = 0; sent < n; sent += inFlight) {
    const outcomes = await Promise.all(
      Array.from({ length: Math.min(inFlight, n - sent) }, () => limiter.consume(rule, 'anyone')),
    );
    count += outcomes.filter((outcome) => outcome.allowed).length;
  }
  return count;
}

/** A config centre whose values a test sets. */
class MapConfigCentre extends RateLimitConfigCentre {
  readonly values = new Map<string, RateLimitOverride>();
  get(configKey: string) {
    return this.values.get(configKey);
  }
}

const HOT = { name: 'hot', count: 1_000, window: '1m', by: 'global', lease: 50 } as const;

describe('leases: a hot counter taken from Redis in batches by each instance', () => {
  const suite = sharedRedisSuite();

  it('admits exactly the limit across instances that all want more, asking Redis once per lease', async () => {
    const { keyPrefix, limiters } = await suite.instances(3);
    await suite.redis.config('RESETSTAT');
    const counts = await Promise.all(limiters.map((limiter) => admitted(limiter, HOT, 600, 25)));
    // Every unit granted was admitted: the instances used up what they held before asking again.
    expect(counts.reduce((a, b) => a + b)).toBe(1_000);
    expect(await suite.redis.get(rateLimitKey(keyPrefix, 'hot', 'global', 'fixed-window'))).toBe('1000');
    // 1,800 decisions; 20 grants of 50, a few smaller ones at the end, and one refusal per instance
    // (more only before its subscription is confirmed). Without leases: 1,800 calls.
    expect(await scriptCalls(suite.redis)).toBeLessThanOrEqual(40);
  });

  it('asks for what is left when a whole lease no longer fits, so the last units are not stranded', async () => {
    const { limiters } = await suite.instances(1);
    const rule = { ...HOT, name: 'tail', count: 120 };
    await suite.redis.config('RESETSTAT');
    expect(await admitted(limiters[0], rule, 200)).toBe(120);
    // Grants of 50 and 50, one of 50 refused with 20 left, then one of 20; then the refusals (one,
    // more only before the subscription is confirmed). Asking one unit at a time would take 20 more.
    expect(await scriptCalls(suite.redis)).toBeLessThanOrEqual(8);
  });

  it('leaves at most a lease per instance unadmitted when an instance stops asking', async () => {
    const { limiters } = await suite.instances(3);
    const [a, b, c] = limiters;
    // a takes a lease for one request and holds the other 49; b and c share what Redis has left.
    expect(await admitted(a, HOT, 1)).toBe(1);
    const others = (await admitted(b, HOT, 600, 10)) + (await admitted(c, HOT, 600, 10));
    expect(others).toBe(1_000 - 50);
    // The bound: what a holds is the only shortfall, and it is still a's to admit.
    expect(await admitted(a, HOT, 100)).toBe(49);
  });

  it('gives back the units a refused request took from its lease', async () => {
    // Without the block cache, every refused request takes its unit from the lease first.
    const { limiters } = await suite.instances(2, { blockCache: false });
    const [a, b] = limiters;
    const perUser = { name: 'per-user', count: 2, window: '1m' } as const;
    let mallory = 0;
    for (let i = 0; i < 20; i += 1) if ((await a.consume([HOT, perUser], 'mallory')).allowed) mallory += 1;
    expect(mallory).toBe(2);
    // Had the 18 refused requests kept their global units, the others would get 18 fewer.
    const others = (await admitted(a, HOT, 1_200, 10)) + (await admitted(b, HOT, 1_200, 10));
    expect(others).toBe(1_000 - 2);
  });

  it('reports a leased rule that would admit the request as admitting when another rule refuses', async () => {
    const { limiters } = await suite.instances(2);
    const [a, b] = limiters;
    const hot = { ...HOT, name: 'small', count: 60 } as const;
    const perUser = { name: 'once', count: 1, window: '1m' } as const;
    expect((await a.consume([hot, perUser], 'mallory')).allowed).toBe(true);
    // a holds 49 of the 50 it was granted; Redis has 10 left. b asks for a lease of 50, which Redis
    // refuses for its size, and for mallory's second request, which the per-user rule refuses.
    const refused = await b.consume([hot, perUser], 'mallory');
    expect(refused.allowed).toBe(false);
    expect(refused.reported!.rule.name).toBe('once');
    expect(refused.decisions[0]).toMatchObject({ allowed: true, remaining: 9 });
  });

  it('asks Redis no more once it refused, until the window ends; units held then are not carried over', async () => {
    let now = 1_800_000_000_000;
    const { limiters } = await suite.instances(2, { clock: () => now });
    const [a, b] = limiters;
    expect((await admitted(a, HOT, 700, 10)) + (await admitted(b, HOT, 700, 10))).toBe(1_000);
    // Once the news of lowered counts reaches both (their subscriptions), refusals stay local.
    await until(
      async () => {
        await suite.redis.config('RESETSTAT');
        await admitted(a, HOT, 20, 5);
        await admitted(b, HOT, 20, 5);
        return (await scriptCalls(suite.redis)) === 0;
      },
      { timeoutMs: 2_000, intervalMs: 10, what: 'refusals answered without Redis' },
    );
    const refused = await a.consume(HOT, 'anyone');
    expect(refused.allowed).toBe(false);
    expect(refused.reported).toMatchObject({ limit: 1_000, remaining: 0 });
    expect(refused.reported!.resetMs).toBeLessThanOrEqual(60_000);

    // The next window: a takes a lease and holds 49 units of it when the window ends.
    now += 60_000;
    expect(await admitted(a, HOT, 1)).toBe(1);
    now += 60_000;
    // Had a carried its 49 into this window, it would admit 1,049 here.
    expect(await admitted(a, HOT, 1_200, 10)).toBe(1_000);
  });

  it('ends a lease no later than the window on Redis’s clock', async () => {
    const { keyPrefix, limiters } = await suite.instances(1);
    const [a] = limiters;
    const short = { ...HOT, name: 'short', window: 300 } as const;
    const key = rateLimitKey(keyPrefix, 'short', 'global', 'fixed-window');
    expect(await admitted(a, short, 1)).toBe(1);
    // a holds 49. Once Redis has ended the window (the key expires on its own clock)...
    await until(async () => (await suite.redis.exists(key)) === 0, {
      timeoutMs: 2_000,
      intervalMs: 10,
      what: 'the window ending in Redis',
    });
    // ...the next request asks Redis for the new window instead of using them.
    await suite.redis.config('RESETSTAT');
    expect(await admitted(a, short, 1)).toBe(1);
    expect(await scriptCalls(suite.redis)).toBe(1);
    expect(await suite.redis.get(key)).toBe('50');
  });

  it('drops every instance’s lease when one resets the counter', async () => {
    const { limiters } = await suite.instances(2);
    const [a, b] = limiters;
    expect(await admitted(a, HOT, 1)).toBe(1);
    expect(await admitted(b, HOT, 1)).toBe(1);
    // a and b hold 49 each. After the reset Redis counts from 0: units held from before would be
    // admitted on top of the limit if they stayed.
    await a.reset(HOT, 'anyone');
    // b drops its lease when the news reaches it (pub/sub): its next request asks Redis again.
    let fromOldLease = 0;
    await until(
      async () => {
        await suite.redis.config('RESETSTAT');
        expect((await b.consume(HOT, 'anyone')).allowed).toBe(true);
        if ((await scriptCalls(suite.redis)) > 0) return true;
        fromOldLease += 1;
        return false;
      },
      { timeoutMs: 2_000, intervalMs: 20, what: 'b asking Redis after the reset' },
    );
    // It did not use up the 49 first.
    expect(fromOldLease).toBeLessThan(49);
    // 1,000 after the reset, less b's probe that asked; a kept none of its 49 either.
    const rest = (await admitted(a, HOT, 1_200, 10)) + (await admitted(b, HOT, 1_200, 10));
    expect(rest).toBe(999);
  });

  it('drops a lease when the config centre changes the limit, so a cut limit holds at once', async () => {
    const centre = new MapConfigCentre();
    const { limiters } = await suite.instances(1, { configCentre: centre });
    const [a] = limiters;
    const rule = { ...HOT, configKey: 'hot' } as const;
    expect(await admitted(a, rule, 1)).toBe(1);
    // a holds 49 of the 50 units Redis granted it; the limit is cut to 10, which Redis's count of
    // 50 already passes. Had a kept admitting what it holds, 49 more would pass.
    centre.values.set('hot', { count: 10 });
    expect(await admitted(a, rule, 50)).toBe(0);
    // Raised: Redis grants what its count leaves (the 49 dropped are the price of the change).
    centre.values.set('hot', { count: 2_000 });
    expect(await admitted(a, rule, 3_000, 10)).toBe(2_000 - 50);
  });

  it('keeps admitting the units it holds while Redis is down, then follows the store-error policy', async () => {
    const own = await startRedisServer();
    try {
      const store = await createStore({ redis: own.url, storeErrors: { policy: 'deny', timeoutMs: 50 } });
      suite.closeAfter(store.close);
      expect((await store.limiter.consume(HOT, 'anyone')).allowed).toBe(true);
      await own.kill();
      // Concurrent requests that find the lease empty share one failed grant: one deadline, not one each.
      const outcomes = [];
      for (let i = 0; i < 49; i += 1) outcomes.push(await store.limiter.consume(HOT, 'anyone'));
      outcomes.push(...(await Promise.all(Array.from({ length: 10 }, () => store.limiter.consume(HOT, 'anyone')))));
      const fromLease = outcomes.filter((outcome) => outcome.allowed && outcome.storeError === undefined);
      expect(fromLease).toHaveLength(49);
      expect(outcomes.slice(49).every((outcome) => !outcome.allowed && outcome.storeError === 'deny')).toBe(true);
    } finally {
      await own.stop();
    }
  });
});

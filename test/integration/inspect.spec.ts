import type { RateLimiterService } from 'nest-rate-limit';
import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from 'nest-rate-limit/store';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { describeStores } from '../support/matrix.js';
import { createStore } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

describeStores('inspecting and resetting an identity', (store) => {
  let limiter: RateLimiterService;
  let close: () => Promise<void>;

  beforeEach(async () => {
    ({ limiter, close } = await createStore({ redis: await store.redis(), keyPrefix: uniquePrefix() }));
  });

  afterEach(async () => {
    await close();
  });

  const rule = (algorithm: RateLimitAlgorithmName) => ({
    name: `inspected-${algorithm}`,
    count: 5,
    window: '1m',
    algorithm,
  });

  it.each(ALGORITHM_NAMES)('%s: used, remaining and reset, counting nothing itself', async (algorithm) => {
    expect(await limiter.inspect(rule(algorithm), 'fresh')).toMatchObject({
      rule: `inspected-${algorithm}`,
      identity: 'fresh',
      algorithm,
      limit: 5,
      used: 0,
      remaining: 5,
      resetMs: 0,
      blockedMs: 0,
    });
    for (let i = 0; i < 3; i += 1) expect((await limiter.consume(rule(algorithm), 'alice')).allowed).toBe(true);
    const first = await limiter.inspect(rule(algorithm), 'alice');
    expect(first).toMatchObject({ used: 3, remaining: 2 });
    expect(first.resetMs).toBeGreaterThan(0);
    // A sliding window's units weigh on until the window after theirs has passed.
    expect(first.resetMs).toBeLessThanOrEqual(algorithm === 'sliding-window' ? 120_000 : 60_000);
    // Reading counts nothing: the same again, and the two units left are still there.
    expect((await limiter.inspect(rule(algorithm), 'alice')).used).toBe(3);
    const outcomes = [];
    for (let i = 0; i < 3; i += 1) outcomes.push((await limiter.consume(rule(algorithm), 'alice')).allowed);
    expect(outcomes).toEqual([true, true, false]);
    await limiter.reset(rule(algorithm), 'alice');
    expect(await limiter.inspect(rule(algorithm), 'alice')).toMatchObject({ used: 0, remaining: 5, resetMs: 0 });
  });

  it('a penalty: its time left, gone with a reset', async () => {
    const blocking = { name: 'inspected-block', count: 1, window: '1s', blockFor: '1h' };
    await limiter.consume(blocking, 'mallory');
    expect((await limiter.consume(blocking, 'mallory')).allowed).toBe(false);
    const blocked = await limiter.inspect(blocking, 'mallory');
    expect(blocked.blockedMs).toBeGreaterThan(3_500_000);
    expect(blocked.blockedMs).toBeLessThanOrEqual(3_600_000);
    await limiter.reset(blocking, 'mallory');
    expect((await limiter.inspect(blocking, 'mallory')).blockedMs).toBe(0);
    expect((await limiter.consume(blocking, 'mallory')).allowed).toBe(true);
  });
});

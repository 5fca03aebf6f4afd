import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import {
  ALGORITHM_NAMES,
  type RateLimitHit,
  type RateLimitStore,
  type RedisService,
  keysBeside,
} from 'nest-rate-limit/store';
import { fixedWindowCount, plantFixedWindow } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

const GRACE_MS = 1_000;

/** Keys the library writes, planted as older code, a bad restore or another program would leave them. */
describe('keys found without a TTL or corrupt are mended by the next request that touches them', () => {
  let server: RedisServer;
  let redis: Redis;
  let store: RateLimitStore;
  let service: RedisService;
  let close: () => Promise<void>;
  // Decisions on a fake clock (passed to every call); TTLs run on Redis's own.
  const t0 = 1_800_000_000_000;
  const logs = new LogCapture();
  /** Whether the store reported mending a key of this rule (one line per rule and interval, at once). */
  const mended = (rule: RateLimitHit) => logs.at('error', /Mended a key/).some((line) => line.includes(rule.key));

  beforeAll(async () => {
    // Only Date: the store's problem lines are sampled on it (decisions take t0, TTLs run on Redis).
    vi.useFakeTimers({ toFake: ['Date'] });
    server = await startRedisServer();
    redis = server.client();
    // Markers from half the limit on, so a rule of 2 writes one at its first admission.
    ({
      store,
      redis: service,
      close,
    } = await createStore({ redis: server.url, storeErrors: { timeoutMs: 1_000 }, failover: { marker: 0.5 } }, logs));
  });

  afterAll(async () => {
    vi.useRealTimers();
    await close?.();
    await server?.stop();
  });

  const keyOf = (name: string, algorithm: RateLimitAlgorithmName = 'fixed-window') => {
    const key = `${uniquePrefix()}:{${name}}:r:${algorithm}`;
    // Past the problem log's line cap (a line a second), so this rule's first repair gets its line.
    vi.setSystemTime(Date.now() + 1_001);
    return (overrides: Partial<RateLimitHit> & { limit: number; windowMs: number }) => {
      const made = hit(key, { algorithm, ...overrides });
      return { ...made, ...keysBeside(key) };
    };
  };

  const admitted = async (hits: RateLimitHit[], now: number) => (await store.consume(hits, now)).allowed;

  it.each(ALGORITHM_NAMES)(
    '%s: a full counter without a TTL gets one and frees the client when its window ends',
    async (algorithm) => {
      const rule = keyOf(`counter-${algorithm}`, algorithm)({ limit: 2, windowMs: 10_000 });
      expect(await admitted([rule], t0)).toBe(true);
      expect(await admitted([rule], t0)).toBe(true);
      await redis.persist(rule.key);
      const refused = await store.consume([rule], t0 + 1);
      expect(refused.allowed).toBe(false);
      expect(mended(rule)).toBe(true);
      const ttl = await redis.pttl(rule.key);
      expect(ttl).toBeGreaterThan(0);
      expect(ttl).toBeLessThanOrEqual(20_000 + GRACE_MS);
      // Every algorithm has its full limit back two windows later (sliding-window: the previous one weighs no more).
      expect(await admitted([rule], t0 + 20_001)).toBe(true);
    },
  );

  it('a block key without a TTL gets one no longer than the penalty, however far its end claims to be', async () => {
    for (const planted of ['own', 'far']) {
      const rule = keyOf(`block-${planted}`)({ limit: 1, windowMs: 1_000, blockMs: 60_000 });
      expect(await admitted([rule], t0)).toBe(true);
      expect(await admitted([rule], t0)).toBe(false);
      if (planted === 'far') await redis.set(rule.blockKey, String(t0 + 10 * 365 * 86_400_000));
      else await redis.persist(rule.blockKey);
      expect(await redis.pttl(rule.blockKey)).toBe(-1);

      const blocked = await store.consume([rule], t0 + 2_000);
      expect(blocked.allowed).toBe(false);
      expect(mended(rule)).toBe(true);
      const ttl = await redis.pttl(rule.blockKey);
      expect(ttl).toBeGreaterThan(0);
      expect(ttl).toBeLessThanOrEqual(60_000 + GRACE_MS);
      if (planted === 'own') {
        // The penalty as the rule gave it: over at t0 + 60 s.
        expect(await admitted([rule], t0 + 59_999)).toBe(false);
        expect(await admitted([rule], t0 + 60_001)).toBe(true);
      }
    }
  });

  it('a block claiming an end years away lasts no longer than its mended TTL', async () => {
    const rule = keyOf('block-short')({ limit: 1, windowMs: 1_000, blockMs: 200 });
    await redis.set(rule.blockKey, '99999999999999999');
    expect(await admitted([rule], t0)).toBe(false);
    const ttl = await redis.pttl(rule.blockKey);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(200 + GRACE_MS);
    // Redis drops the key when the TTL runs out (real time on Redis's clock: at most 1.2 s); then the
    // client is admitted.
    await until(async () => (await redis.exists(rule.blockKey)) === 0, {
      timeoutMs: 5_000,
      intervalMs: 50,
      what: `Redis expiring ${rule.blockKey}`,
    });
    expect(await admitted([rule], t0)).toBe(true);
  });

  it('a marker without a TTL gets one (two windows) when a lost counter resumes from it, even on a refusal', async () => {
    const rule = keyOf('marker')({ limit: 4, windowMs: 10_000 });
    for (let i = 0; i < 4; i += 1) expect(await admitted([rule], t0)).toBe(true);
    await redis.persist(rule.markerKey);
    await redis.del(rule.key);
    // The window resumes full from the marker: refused, so nothing is written that would set a TTL.
    const resumed = await store.consume([rule], t0 + 1);
    expect(resumed.allowed).toBe(false);
    expect(mended(rule)).toBe(true);
    const ttl = await redis.pttl(rule.markerKey);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(20_000);
  });

  // As in the demo: four wrong passwords at /login (countOn: 'failure', blockFor), then every key of
  // the client PERSISTed. The next request mended the counter and the block key, and left the marker
  // without a TTL for as long as its counter lived (and for ever if it outlived it).
  it.each([
    ['a lockout (countOn, blockFor): refused by the block', { conditional: true, blockMs: 60_000 }],
    ['a full window: refused by the count', {}],
    ['a window with room: admitted below the marker', { limit: 20 }],
  ] as const)(
    'on Redis’s clock, a marker without a TTL gets its counter’s end from the next request: %s',
    async (_, shape) => {
      const rule = keyOf(`marker-ttl-${Object.keys(shape).join('-') || 'full'}`)({
        limit: 3,
        windowMs: 60_000,
        ...shape,
      });
      // Markers from half the limit (this store's failover.marker: 0.5): the second admission writes one.
      for (let i = 0; i < 2; i += 1) {
        const admission = await store.consume([rule]);
        expect(admission.allowed).toBe(true);
        // A failed login: its units stay counted.
        if (rule.conditional) await store.settle([{ hit: rule, receipt: admission.receipts![0], refund: false }]);
      }
      if (rule.limit === 3) {
        const third = await store.consume([rule]);
        if (rule.conditional) await store.settle([{ hit: rule, receipt: third.receipts![0], refund: false }]);
        // The fourth wrong password: refused, and the lockout starts.
        expect((await store.consume([rule])).allowed).toBe(false);
      }
      // Below its marker's share, a restore or older code left one (a window whose limit was raised).
      if (rule.limit === 20) await redis.set(rule.markerKey, '2');
      expect(await redis.exists(rule.markerKey)).toBe(1);
      for (const key of [rule.key, rule.blockKey, rule.markerKey, rule.pendingKey]) await redis.persist(key);
      expect(await redis.pttl(rule.markerKey)).toBe(-1);

      const next = await store.consume([rule]);
      expect(next.allowed).toBe(rule.limit === 20);
      expect(mended(rule)).toBe(true);
      const counterEnds = await redis.pexpiretime(rule.key);
      expect(counterEnds).toBeGreaterThan(0);
      // The marker lives as long as its counter, not a moment longer: a marker outliving its window
      // would start the next window from its count.
      expect(await redis.pexpiretime(rule.markerKey)).toBe(counterEnds);
      for (const key of [rule.key, rule.blockKey, rule.markerKey, rule.pendingKey]) {
        expect(await redis.pttl(key), key).not.toBe(-1);
      }
    },
  );

  it('a pending key (countOn admissions in flight) without a TTL gets one', async () => {
    const rule = keyOf('pending')({ limit: 1, windowMs: 10_000, conditional: true });
    expect(await admitted([rule], t0)).toBe(true);
    await redis.persist(rule.pendingKey);
    const refused = await store.consume([rule], t0 + 1);
    expect(refused.decisions[0].provisional).toBe(true);
    const ttl = await redis.pttl(rule.pendingKey);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(10_000 + GRACE_MS);
  });

  describe('a key of the wrong type or shape hurts only its identity', () => {
    const plant: Record<RateLimitAlgorithmName, (redis: Redis, key: string) => Promise<unknown>> = {
      'fixed-window': (r, key) => r.set(key, 'not a hash'),
      'sliding-window': (r, key) => r.rpush(key, 'a', 'list'),
      'sliding-log': (r, key) => r.hset(key, 'not', 'a zset'),
      'token-bucket': (r, key) => r.sadd(key, 'a set'),
      gcra: (r, key) => r.hset(key, 'not', 'a string'),
    };

    it.each(ALGORITHM_NAMES)(
      '%s: WRONGTYPE is mended, the request decided on a fresh counter, the circuit stays closed',
      async (algorithm) => {
        const makeHit = keyOf(`wrongtype-${algorithm}`, algorithm);
        const rule = makeHit({ limit: 3, windowMs: 10_000 });
        const other = keyOf(`bystander-${algorithm}`, algorithm)({ limit: 3, windowMs: 10_000 });
        // Far more than the breaker's 5 consecutive failures, if these counted as failures.
        for (let round = 0; round < 12; round += 1) {
          await redis.del(rule.key);
          await plant[algorithm](redis, rule.key);
          const decided = await store.consume([rule], t0);
          expect(decided.allowed).toBe(true);
          expect(decided.decisions[0].remaining).toBe(2);
        }
        expect(mended(rule)).toBe(true);
        expect(service.runner.circuitState).toBe('closed');
        expect(await admitted([other], t0)).toBe(true);
        // The mended key is the algorithm's own again, with a TTL.
        expect(await redis.pttl(rule.key)).toBeGreaterThan(0);
      },
    );

    it('values that are no number (text, NaN, infinity) read as no state, are rewritten, and refuse nobody', async () => {
      for (const junk of ['abc', 'nan', 'inf', '-inf']) {
        const rule = keyOf(`junk-${junk}`)({ limit: 3, windowMs: 10_000 });
        await plantFixedWindow(redis, rule.key, { start: t0, count: junk });
        await redis.pexpire(rule.key, 60_000);
        const decided = await store.consume([rule], t0);
        expect(decided.allowed).toBe(true);
        expect(decided.decisions[0].remaining).toBe(2);
        expect(mended(rule)).toBe(true);
        expect(await fixedWindowCount(redis, rule.key)).toBe(1);
      }
    });

    it('a block key or a marker of the wrong type is mended too', async () => {
      const rule = keyOf('wrongtype-block')({ limit: 2, windowMs: 10_000, blockMs: 60_000 });
      await redis.hset(rule.blockKey, 'not', 'a string');
      await redis.sadd(rule.markerKey, 'not a hash');
      const decided = await store.consume([rule], t0);
      expect(decided.allowed).toBe(true);
      expect(mended(rule)).toBe(true);
      expect(await redis.type(rule.markerKey)).toBe('hash');
      expect(service.runner.circuitState).toBe('closed');
    });
  });
});

import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import {
  ALGORITHM_NAMES,
  MemoryRateLimitStore,
  type RateLimitConsumption,
  type RateLimitHit,
  RateLimitStore,
} from 'nest-rate-limit/store';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';
import { burst as httpBurst, statuses } from '../support/traffic.js';

/** Small, so that a flood of ten times as many identities stays fast. */
const MAX_KEYS = 200;
const FLOOD = 10 * MAX_KEYS;

/** Any epoch time; the fake clock starts here. */
const T0 = 1_700_000_003_000;
/** Past every window, sliding-window's two and every penalty below: all state is really over. */
const ALL_OVER = 3 * 3_600_000;

type RuleShape = Pick<RateLimitHit, 'algorithm' | 'limit' | 'windowMs' | 'burst'>;

/** The victim's rule: 5 units per 10 s (also the burst of token-bucket and gcra). */
const victimRule = (algorithm: RateLimitAlgorithmName): RuleShape => ({
  algorithm,
  limit: 5,
  windowMs: 10_000,
  burst: 5,
});

/** Other routes' rules, with other algorithms, limits and windows; one as long as an hour. */
const OTHER_RULES: RuleShape[] = [
  { algorithm: 'fixed-window', limit: 1_000, windowMs: 3_600_000, burst: 1_000 },
  { algorithm: 'sliding-log', limit: 2, windowMs: 1_000, burst: 2 },
  { algorithm: 'token-bucket', limit: 50, windowMs: 60_000, burst: 100 },
  { algorithm: 'gcra', limit: 20, windowMs: 5_000, burst: 1 },
  { algorithm: 'sliding-window', limit: 7, windowMs: 30_000, burst: 7 },
];

interface Flood {
  name: string;
  /** The rule and cost of the i-th junk identity's request. */
  junk(i: number, victim: RuleShape): { shape: RuleShape; cost: number };
}

const FLOODS: Flood[] = [
  { name: 'the same rule', junk: (_i, victim) => ({ shape: victim, cost: 1 }) },
  {
    name: 'other rules with other limits',
    junk: (i) => ({ shape: OTHER_RULES[i % OTHER_RULES.length], cost: 1 + (i % 2) }),
  },
];

/** The embedded store as the module builds it, on a fake clock. */
async function memoryStore(maxKeys: number, clock: () => number) {
  const built = await createStore({ memoryStore: { maxKeys }, clock });
  expect(built.store).toBeInstanceOf(MemoryRateLimitStore);
  return { ...built, store: built.store as MemoryRateLimitStore };
}

/** Sends `n` one-unit requests at one instant and returns the decisions, in order. */
async function burst(store: RateLimitStore, victim: RateLimitHit, n: number, now: number) {
  const results: RateLimitConsumption[] = [];
  for (let i = 0; i < n; i += 1) results.push(await store.consume([victim], now));
  return results;
}

const admitted = (results: RateLimitConsumption[]) => results.filter((r) => r.allowed).length;

describe('the embedded store under a flood of 10 x memoryStore.maxKeys identities', () => {
  let now = T0;
  const clock = () => now;
  const opened: (() => Promise<void>)[] = [];

  afterEach(async () => {
    await Promise.all(opened.splice(0).map((close) => close()));
  });

  /** The flooded store and a reference one big enough never to evict, for the victim's requests. */
  async function stores() {
    now = T0;
    const flooded = await memoryStore(MAX_KEYS, clock);
    const reference = await memoryStore(FLOOD, clock);
    opened.push(flooded.close, reference.close);
    return { flooded: flooded.store, reference: reference.store };
  }

  /** One request for each of FLOOD junk identities, 1 ms apart; the bound holds after every one. */
  async function flood(store: MemoryRateLimitStore, kind: Flood, victim: RuleShape, tag: string) {
    for (let i = 0; i < FLOOD; i += 1) {
      const { shape, cost } = kind.junk(i, victim);
      now += 1;
      await store.consume([hit(`junk:${tag}:${i}:${shape.algorithm}`, { ...shape, cost })], now);
      if (store.size > MAX_KEYS) expect.fail(`${store.size} keys held after ${i + 1} junk identities`);
    }
  }

  describe.each(ALGORITHM_NAMES)('counters: %s', (algorithm) => {
    const shape = victimRule(algorithm);
    const victim = hit('victim', shape);

    it.each(FLOODS)('a flood on $name resets no count, and charges nothing once the count is over', async (kind) => {
      const { flooded, reference } = await stores();
      for (const store of [flooded, reference]) await burst(store, victim, 3, now);

      now += 1_000;
      await flood(flooded, kind, shape, 'first');
      now += 500;
      const after = {
        flooded: await burst(flooded, victim, 10, now),
        reference: await burst(reference, victim, 10, now),
      };
      // Never more than the victim really has left; an eviction that forgets starts it afresh (5 of 5).
      expect(admitted(after.flooded)).toBeLessThanOrEqual(admitted(after.reference));
      expect(after.flooded[0].decisions[0].remaining).toBeLessThanOrEqual(after.reference[0].decisions[0].remaining);
      expect(admitted(after.reference)).toBeLessThan(shape.limit);

      // Evicted again, with its window all used, among junk of rules as long as an hour.
      await flood(flooded, FLOODS[1], shape, 'second');
      now += 3 * shape.windowMs;
      // Its own state is over: nothing is charged any more, whatever longer-lived junk shares its cells.
      expect(admitted(await burst(flooded, victim, 10, now))).toBe(shape.limit);
    });

    it('units recorded for an evicted key add to what it had', async () => {
      const { flooded, reference } = await stores();
      for (const store of [flooded, reference]) await burst(store, victim, 2, now);
      now += 1_000;
      await flood(flooded, FLOODS[0], shape, 'first');
      for (const store of [flooded, reference]) await store.record([{ ...victim, cost: 2 }], now);
      const after = {
        flooded: await burst(flooded, victim, 10, now),
        reference: await burst(reference, victim, 10, now),
      };
      expect(admitted(after.flooded)).toBeLessThanOrEqual(admitted(after.reference));
      expect(admitted(after.reference)).toBeLessThan(shape.limit - 2);
    });

    it('a refund for an evicted key is taken without error and gives nothing back beyond the refund', async () => {
      const { flooded, reference } = await stores();
      const taken = {
        flooded: await burst(flooded, victim, 3, now),
        reference: await burst(reference, victim, 3, now),
      };
      now += 1_000;
      await flood(flooded, FLOODS[0], shape, 'first');
      for (const [store, results] of [
        [flooded, taken.flooded],
        [reference, taken.reference],
      ] as const) {
        await expect(store.refund([{ hit: victim, receipt: results[2].receipts![0] }])).resolves.toBeUndefined();
      }
      const after = {
        flooded: await burst(flooded, victim, 10, now),
        reference: await burst(reference, victim, 10, now),
      };
      expect(admitted(after.flooded)).toBeLessThanOrEqual(admitted(after.reference));
    });
  });

  describe.each(ALGORITHM_NAMES)('blocks: %s', (algorithm) => {
    /** 2 per second, then 60 s of penalty. */
    const shape: RuleShape = { algorithm, limit: 2, windowMs: 1_000, burst: 2 };
    const penaltyMs = 60_000;
    const victim = hit('victim', { ...shape, blockMs: penaltyMs });

    const BLOCK_FLOODS: { name: string; junk: Partial<RateLimitHit> & { limit: number; windowMs: number } }[] = [
      { name: 'the same rule', junk: { ...shape, blockMs: penaltyMs } },
      {
        name: 'another rule with another penalty',
        junk: { algorithm: 'fixed-window', limit: 1, windowMs: 500, burst: 1, blockMs: 5_000 },
      },
    ];

    it.each(BLOCK_FLOODS)('identities blocked on $name lift no block', async ({ junk }) => {
      const { flooded } = await stores();
      const tries = await burst(flooded, victim, 3, now);
      expect(tries.map((t) => t.allowed)).toEqual([true, true, false]);
      const blockedAt = now;

      // Each junk identity goes past its limit and is blocked in turn.
      for (let i = 0; i < FLOOD; i += 1) {
        now += 1;
        const junkHit = hit(`junk:${i}`, junk);
        for (let n = 0; n <= junk.limit; n += 1) await flooded.consume([junkHit], now);
        if (flooded.size > MAX_KEYS || flooded.blockCount > MAX_KEYS) {
          expect.fail(`${flooded.size} counters and ${flooded.blockCount} blocks held after ${i + 1} identities`);
        }
      }
      // Blocked still, and so is the first junk identity; an eviction that forgets lifts both blocks
      // (and their counters' windows are over), so it admits.
      for (const [blocked, until] of [
        [victim, blockedAt + penaltyMs],
        [hit('junk:0', junk), blockedAt + 1 + junk.blockMs!],
      ] as const) {
        const [decision] = await burst(flooded, blocked, 1, now);
        expect(decision.allowed).toBe(false);
        expect(decision.decisions[0].resetMs).toBeGreaterThanOrEqual(until - now);
      }
      now = blockedAt + penaltyMs / 2;
      const [during] = await burst(flooded, victim, 1, now);
      expect(during.allowed).toBe(false);
      expect(during.decisions[0].resetMs).toBeGreaterThanOrEqual(blockedAt + penaltyMs - now);

      now += ALL_OVER;
      const [over] = await burst(flooded, victim, 1, now);
      expect(over.decisions[0]).toMatchObject({ allowed: true, remaining: shape.limit - 1 });
    });
  });

  it('charges hardly any unseen key while maxKeys evicted keys still matter (the sketch is sized for them)', async () => {
    const { flooded } = await stores();
    const shape = { limit: 10, windowMs: 3_600_000 };
    for (let i = 0; i < 2 * MAX_KEYS; i += 1) await flooded.consume([hit(`seen:${i}`, shape)], now);
    // A cost above the limit is always refused, so it stores nothing, and reports what is charged.
    const probes = 4_000;
    let charged = 0;
    for (let i = 0; i < probes; i += 1) {
      const { decisions } = await flooded.consume([hit(`unseen:${i}`, { ...shape, cost: 11 })], now);
      if (decisions[0].remaining < shape.limit) charged += 1;
    }
    expect(flooded.size).toBe(MAX_KEYS);
    // The documented bound, 1 in 40; about 1 in 90 is expected at this size.
    expect(charged).toBeLessThanOrEqual(probes / 40);
  });
});

describe('the demo app on the embedded store, flooded with junk x-api-keys', () => {
  let app: INestApplication;
  const store = new MemoryRateLimitStore(MAX_KEYS);
  const env = { ...process.env };

  beforeAll(async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    delete process.env.REDIS_URL;
    process.env.RATE_LIMIT_PREFIX = uniquePrefix();
    // The module's own store, with fewer keys than the demo's default, so that a 10x flood is quick.
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] })
      .overrideProvider(RateLimitStore)
      .useValue(store)
      .compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');
  });

  afterAll(async () => {
    vi.useRealTimers();
    await app?.close();
    process.env = env;
  });

  const get = (path: string, headers: Record<string, string> = {}) =>
    request(app.getHttpServer()).get(path).set(headers);

  /** FLOOD junk API keys, one request each; past the sketch's size some are refused (false positives). */
  async function floodKeys(tag: string) {
    for (let i = 0; i < FLOOD; i += 50) {
      const batch = await httpBurst(50, (j) => get('/key', { 'x-api-key': `junk-${tag}-${i + j}` }));
      for (const status of batch.statuses) expect([200, 429]).toContain(status);
      expect(store.size).toBeLessThanOrEqual(MAX_KEYS);
    }
  }

  it("keeps another key's count and a half-done login lockout, then the lockout itself", async () => {
    const victim = { 'x-api-key': 'victim' };
    expect(await statuses(app, '/key', 2, victim)).toEqual([200, 200]);
    expect(await statuses(app, '/login?password=nope', 2)).toEqual([401, 401]);

    await floodKeys('first');
    // One of 3 left (or none, for a false positive); an eviction that forgets starts the key afresh.
    const key = await statuses(app, '/key', 3, victim);
    expect(key.filter((status) => status === 200).length).toBeLessThanOrEqual(1);
    expect(key.at(-1)).toBe(429);
    // At most one failed login left before the lockout, not three.
    const login = await statuses(app, '/login?password=nope', 2);
    expect(login.filter((status) => status === 401).length).toBeLessThanOrEqual(1);
    expect(login.at(-1)).toBe(429);
    await get('/login?password=demo').expect(429);

    await floodKeys('second');
    await get('/login?password=demo').expect(429);
    vi.setSystemTime(Date.now() + 5 * 60_000 + 1_000);
    await get('/login?password=demo').expect(200);
  });
});

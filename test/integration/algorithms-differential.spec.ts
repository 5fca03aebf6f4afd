import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import { ALGORITHM_NAMES, MemoryRateLimitStore, type RateLimitHit, type RateLimitStore } from 'nest-rate-limit/store';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

interface RuleShape {
  algorithm: RateLimitAlgorithmName;
  limit: number;
  windowMs: number;
  burst: number;
  blockMs: number;
  /** A `countOn` rule: admissions stay in flight until settled, and rejections they cause are provisional. */
  conditional: boolean;
  /** A `settleCost` rule (never a `countOn` one): the most an admission may yet be charged, held in flight. */
  overdraftBound: number | undefined;
}

const rule = (algorithm: fc.Arbitrary<RateLimitAlgorithmName>): fc.Arbitrary<RuleShape> =>
  fc.record({
    algorithm,
    limit: fc.integer({ min: 1, max: 8 }),
    windowMs: fc.constantFrom(1_000, 1_500, 7_000, 60_000),
    burst: fc.integer({ min: 1, max: 10 }),
    blockMs: fc.constantFrom(0, 0, 0, 500, 3_000),
    conditional: fc.constantFrom(false, false, true),
    overdraftBound: fc.constantFrom(undefined, undefined, undefined, 0, 2, 5),
  });

/**
 * Requests: gaps on a fake clock (bursts, idles across several windows, now and then a clock that
 * goes back or reads a fraction of a millisecond), costs (0 included, and now and then one far past
 * any limit, as a settled cost may be), and windows that change between requests as a config
 * centre may change them.
 */
const traffic = fc.array(
  fc.record({
    gapMs: fc.oneof(
      fc.integer({ min: 0, max: 40 }),
      fc.integer({ min: 0, max: 4_000 }),
      fc.constant(0),
      fc.integer({ min: -1_500, max: -1 }),
      fc.double({ min: 0, max: 50, noNaN: true }),
    ),
    cost: fc.oneof(
      { arbitrary: fc.constant(1), weight: 5 },
      { arbitrary: fc.integer({ min: 0, max: 4 }), weight: 5 },
      { arbitrary: fc.constantFrom(1_000_000, Number.MAX_SAFE_INTEGER), weight: 1 },
    ),
    windowScale: fc.constantFrom(1, 1, 1, 1, 2, 0.5),
    /** Record the units without deciding (as after an outage) instead of asking. */
    record: fc.constantFrom(false, false, false, false, false, false, false, false, false, true),
    /** Settle this request (if admitted) that many requests later; -1: never. */
    refundAfter: fc.oneof(fc.constant(-1), fc.constant(-1), fc.integer({ min: 0, max: 5 })),
    /** When settled: keep its units (a `countOn` response that counts) instead of refunding them. */
    keep: fc.constantFrom(false, false, true),
    /** When refunded, a `settleCost` rule's share of its units taken back (settled for less than reserved). */
    refundShare: fc.constantFrom(1, 1, 0.5),
    /** When settled and kept: units charged past the cost (a `settleCost` overdraft), ending its claim. */
    overdraft: fc.constantFrom(0, 0, 1, 3),
  }),
  { minLength: 1, maxLength: 40 },
);

/** The time base: any epoch ms, so window alignment falls anywhere. */
const start = fc.integer({ min: 1_600_000_000_000, max: 1_900_000_000_000 });

describe('Redis scripts and the embedded store decide and refund alike (property-based, fake clock)', () => {
  let server: RedisServer;
  let redisStore: RateLimitStore;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    // The scripts against their twins: refunds here lower counts at will, which the lost-write check
    // (a failover defence, with its own suite) would take for lost writes. The marker (off by default)
    // is on: it must not change any decision.
    ({ store: redisStore, close } = await createStore({
      redis: server.url,
      storeErrors: { timeoutMs: 2_000 },
      failover: { detectLostWrites: false, marker: 0.8 },
    }));
  });

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  async function replay(
    rules: RuleShape[],
    requests: {
      gapMs: number;
      cost: number;
      refundAfter: number;
      keep: boolean;
      overdraft: number;
      refundShare: number;
      windowScale: number;
      record: boolean;
    }[],
    t0: number,
  ): Promise<void> {
    const identity = uniquePrefix();
    const memory = new MemoryRateLimitStore(1_000);
    const pending: { due: number; refund: () => Promise<unknown> }[] = [];
    let now = t0;
    for (const [
      step,
      { gapMs, cost, refundAfter, keep, overdraft, refundShare, windowScale, record },
    ] of requests.entries()) {
      now += gapMs;
      for (const { refund } of pending.filter((p) => p.due === step)) await refund();
      const hits: RateLimitHit[] = rules.map((shape, i) => ({
        ...shape,
        windowMs: Math.max(1, Math.round(shape.windowMs * windowScale)),
        key: `p:{${identity}}:r${i}:${shape.algorithm}`,
        cost,
        overdraftBound: shape.conditional ? undefined : shape.overdraftBound,
      }));
      if (record) {
        await Promise.all([redisStore.record(hits, now), memory.record(hits, now)]);
        continue;
      }
      const [fromRedis, fromMemory] = await Promise.all([redisStore.consume(hits, now), memory.consume(hits, now)]);
      const at = `step ${step} at +${now - t0} ms`;
      expect(fromRedis.allowed, at).toBe(fromMemory.allowed);
      expect(fromRedis.decisions, at).toEqual(fromMemory.decisions);
      if (fromRedis.allowed && refundAfter >= 0) {
        const redisReceipts = fromRedis.receipts!;
        const memoryReceipts = fromMemory.receipts!;
        // A settleCost rule's overdraft: a charge that ends the admission's claim (as `settleCost` sends it).
        const charged = (receipts: typeof redisReceipts) =>
          hits.flatMap((hit, i) =>
            keep && overdraft > 0 && hit.overdraftBound !== undefined
              ? [{ ...hit, cost: overdraft, settles: receipts[i].nonce }]
              : [],
          );
        const settled = (receipts: typeof redisReceipts) =>
          hits.flatMap((hit, i) =>
            keep && overdraft > 0 && hit.overdraftBound !== undefined
              ? []
              : [
                  {
                    hit:
                      keep || hit.overdraftBound === undefined
                        ? hit
                        : { ...hit, cost: Math.floor(hit.cost * refundShare) },
                    receipt: receipts[i],
                    refund: !keep,
                  },
                ],
          );
        pending.push({
          due: step + refundAfter + 1,
          refund: () =>
            Promise.all([
              redisStore.settle(settled(redisReceipts)),
              memory.settle(settled(memoryReceipts)),
              redisStore.record(charged(redisReceipts), now),
              memory.record(charged(memoryReceipts), now),
            ]),
        });
      }
    }
  }

  it.each(ALGORITHM_NAMES)('%s', async (algorithm) => {
    await fc.assert(
      fc.asyncProperty(rule(fc.constant(algorithm)), traffic, start, (shape, requests, t0) =>
        replay([shape], requests, t0),
      ),
      { numRuns: 60 },
    );
  });

  it('several rules of any algorithms on one request: all admit and move, or none moves', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(rule(fc.constantFrom(...ALGORITHM_NAMES)), { minLength: 2, maxLength: 3 }),
        traffic,
        start,
        (shapes, requests, t0) => replay(shapes, requests, t0),
      ),
      { numRuns: 60 },
    );
  });
});

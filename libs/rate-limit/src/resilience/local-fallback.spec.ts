import { describe, expect, it } from 'vitest';
import type { RateLimitConsumption, RateLimitHit } from '../store/rate-limit-store.js';
import { LocalFallback } from './local-fallback.js';
import { ReportedWindows } from './resilient-store.js';

const hit = (key: string, limit = 5, windowMs = 1_000): RateLimitHit => ({
  key,
  conditional: false,
  algorithm: 'fixed-window',
  cost: 1,
  limit,
  burst: limit,
  windowMs,
  blockMs: 0,
});

/** What Redis answers for an admitted hit: `used` units counted, `resetMs` left in the window. */
const answer = (limit: number, used: number, resetMs: number): RateLimitConsumption => ({
  allowed: true,
  decisions: [{ allowed: true, limit, remaining: limit - used, resetMs }],
  receipts: undefined,
});

/**
 * How many of `n` requests the fallback admits at `now`; by default of calls that never went out
 * (an outage), `unsent` false for calls past their deadline (a slow Redis).
 */
const admitted = (fallback: LocalFallback, request: RateLimitHit, n: number, now: number, unsent = true) =>
  Array.from({ length: n }, () => fallback.consume([request], now, unsent).allowed).filter(Boolean).length;

const fallbackFor = (instances: number | undefined, expectedInstances = 2) =>
  new LocalFallback(new ReportedWindows(100), { instances: () => instances, expectedInstances, maxKeys: 100 });

describe('LocalFallback: each instance takes its share of the limit, at most 1.05x in all', () => {
  it('of a window Redis never reported on: limit / instances counted on Redis, rounded up within 1.05x', () => {
    expect(admitted(fallbackFor(3), hit('a', 100), 50, 0)).toBe(34); // 100 / 3 up: 102 in all
    expect(admitted(fallbackFor(1), hit('a'), 10, 0)).toBe(5); // one instance: exactly the limit
    // Up would be 2 each, 6 in all: past 1.05 x 5. Down: 1 each.
    expect(admitted(fallbackFor(3), hit('a'), 10, 0)).toBe(1);
  });

  it('assumes expectedInstances while the instances are not counted', () => {
    expect(admitted(fallbackFor(undefined, 2), hit('a', 30), 20, 0)).toBe(15);
    expect(admitted(fallbackFor(undefined, 4), hit('a', 30), 20, 0)).toBe(7); // 8 each would be 32
  });

  it('admits nothing locally where one unit each would pass 1.05x the limit', () => {
    expect(admitted(fallbackFor(3), hit('a', 2), 5, 0)).toBe(0); // 2.1 / 3
  });

  it('of what Redis last said was left in the window, for the rest of it, then afresh', () => {
    const fallback = fallbackFor(3);
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 15, 800), 200); // window ends at 1,000
    expect(admitted(fallback, hit('a', 30), 10, 300)).toBe(5); // (30 - 15) / 3
    expect(admitted(fallback, hit('a', 30), 10, 900)).toBe(0);
    expect(admitted(fallback, hit('a', 30), 20, 1_000)).toBe(10); // a window Redis has not reported on
  });

  it('learns from late answers, keeping the highest count of a window', () => {
    const fallback = fallbackFor(3);
    fallback.lastSeen.remember([hit('a')], answer(5, 5, 700), 300);
    fallback.lastSeen.remember([hit('a')], answer(5, 2, 690), 310); // an older answer, arriving later
    expect(admitted(fallback, hit('a'), 5, 320)).toBe(0);
  });

  it("keeps what it admitted in a window it guessed when Redis's own, found later, overlaps it", () => {
    const fallback = fallbackFor(3);
    // Redis stalled: the first decision starts a window here at 100 (to 1,100)...
    expect(admitted(fallback, hit('a', 30), 20, 100)).toBe(10);
    // ...and Redis ran the late calls at 400: its window ends at 1,400, six counted.
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 6, 1_000), 400);
    // (30 - 6) / 3 = 8, and 10 were admitted here in that second already.
    expect(admitted(fallback, hit('a', 30), 5, 500)).toBe(0);
  });

  it('starts afresh in a window of Redis that begins after the guessed one', () => {
    const fallback = fallbackFor(3);
    expect(admitted(fallback, hit('a', 30), 20, 0)).toBe(10); // guessed: 0 to 1,000
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 0, 1_000), 1_050); // Redis's: 1,050 to 2,050
    expect(admitted(fallback, hit('a', 30), 20, 1_100)).toBe(10);
  });

  it('decides all rules of a request or none', () => {
    const fallback = fallbackFor(1);
    const tight = hit('tight', 1);
    const loose = hit('loose', 10);
    expect(fallback.consume([tight, loose], 0, true).allowed).toBe(true); // 1.05 x 1: 1
    const refused = fallback.consume([tight, loose], 0, true);
    expect(refused.allowed).toBe(false);
    expect(refused.decisions.map((decision) => decision.allowed)).toEqual([false, true]);
    // The refused request took nothing from the loose rule: 10 - 1 left.
    expect(admitted(fallback, loose, 20, 0)).toBe(9);
  });

  it('records only what it admitted without reaching Redis, in the window it belongs to', () => {
    const fallback = fallbackFor(1);
    admitted(fallback, hit('sent'), 2, 0, false);
    admitted(fallback, hit('unsent'), 3, 0, true);
    const pending = fallback.pending.take(10);
    expect(pending.map((units) => [units.hit.key, units.hit.cost, units.until])).toEqual([['unsent', 3, 1_000]]);
    expect(fallback.pending.hasIn(new Set(['']))).toBe(false);
    fallback.pending.putBack(pending);
    expect(fallback.pending.take(10).map((units) => units.hit.cost)).toEqual([3]);
    // Units of a window that is over are not recorded.
    admitted(fallback, hit('late'), 1, 0, true);
    expect(fallback.pending.take(1_000)).toEqual([]);
  });

  it("records a shard's units once that shard answers, the others' later", () => {
    const fallback = new LocalFallback(new ReportedWindows(100), {
      expectedInstances: 1,
      maxKeys: 100,
      shardOf: (key) => key.slice(0, 1),
    });
    admitted(fallback, hit('a1'), 2, 0);
    admitted(fallback, hit('b1'), 1, 0);
    admitted(fallback, hit('b2'), 1, 0);
    expect(fallback.pending.hasIn(new Set(['c']))).toBe(false);
    const taken = fallback.pending.take(10, new Set(['b'])).map((units) => [units.hit.key, units.hit.cost]);
    expect(taken.sort()).toEqual([
      ['b1', 1],
      ['b2', 1],
    ]);
    expect(fallback.pending.hasIn(new Set(['b']))).toBe(false);
    expect(fallback.pending.hasIn(new Set(['a', 'b']))).toBe(true);
    expect(fallback.pending.take(10, new Set(['a'])).map((units) => [units.hit.key, units.hit.cost])).toEqual([
      ['a1', 2],
    ]);
    expect(fallback.pending.hasIn(new Set(['a']))).toBe(false);
  });

  it('counts what the other instances admitted since it last heard, at their rate, until the failed call went out', () => {
    const fallback = fallbackFor(3);
    // The key grew from 10 to 16 over 300 ms as this instance heard it: 0.02 units per ms in all.
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 10, 1_000), 0);
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 16, 700), 300);
    // The failed call went out 300 ms later: the two others admitted 2/3 of 6 meanwhile, 4.
    // (30 - 20) / 3 up is 4, past 1.05x: 3 each.
    expect(fallback.consume([hit('a', 30)], 900, true, false, 600).decisions[0].remaining).toBe(2);
    // Not told when the call went out: until the decision, 0.02 x 600 x 2/3 = 8, 24 used, 2 each.
    const unknown = fallbackFor(3);
    unknown.lastSeen.remember([hit('a', 30)], answer(30, 10, 1_000), 0);
    unknown.lastSeen.remember([hit('a', 30)], answer(30, 16, 700), 300);
    expect(admitted(unknown, hit('a', 30), 5, 900)).toBe(2);
    // A lone instance heard every admission: nothing to add.
    const lone = fallbackFor(1);
    lone.lastSeen.remember([hit('a', 30)], answer(30, 10, 1_000), 0);
    lone.lastSeen.remember([hit('a', 30)], answer(30, 16, 700), 300);
    expect(admitted(lone, hit('a', 30), 20, 900)).toBe(14);
  });

  it('holds the share it took of a window until the window ends, Redis answering again or not', () => {
    const fallback = fallbackFor(3);
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 15, 800), 200); // window ends at 1,000
    expect(admitted(fallback, hit('a', 30), 10, 300)).toBe(5); // (30 - 15) / 3
    // Redis is back, and admits: this instance has no share left in the window.
    expect(fallback.holdsShares([hit('a', 30)], 400)).toBe(false);
    // Another key, never decided here: nothing held.
    expect(fallback.holdsShares([hit('b', 30)], 400)).toBe(true);
    // The window over: nothing held.
    expect(fallback.holdsShares([hit('a', 30)], 1_000)).toBe(true);
  });

  it('holds a share for 10 s after its last local decision at most, however long the window', () => {
    const fallback = fallbackFor(3);
    fallback.lastSeen.remember([hit('a', 30, 3_600_000)], answer(30, 15, 3_600_000), 0); // an hour-long window
    expect(admitted(fallback, hit('a', 30, 3_600_000), 10, 100)).toBe(5); // a blip at 100 ms
    expect(fallback.holdsShares([hit('a', 30, 3_600_000)], 10_099)).toBe(false);
    expect(fallback.holdsShares([hit('a', 30, 3_600_000)], 10_100)).toBe(true);
  });

  it('counts what Redis admits within a held share against it', () => {
    const fallback = fallbackFor(3);
    fallback.lastSeen.remember([hit('a', 30)], answer(30, 15, 800), 200);
    expect(admitted(fallback, hit('a', 30), 2, 300)).toBe(2); // 2 of its 5
    const redisAdmits = () => fallback.holdsShares([hit('a', 30)], 400);
    expect([redisAdmits(), redisAdmits(), redisAdmits(), redisAdmits()]).toEqual([true, true, true, false]);
  });

  it('shares only the margin above the limit for calls that may have reached Redis', () => {
    // Redis may be up and admitting the limit on time to other instances.
    expect(admitted(fallbackFor(2), hit('a', 5), 10, 0, false)).toBe(0); // 1 / 2
    expect(admitted(fallbackFor(3), hit('a', 5), 10, 0, false)).toBe(0); // 1 / 3
    expect(admitted(fallbackFor(3), hit('a', 50), 20, 0, false)).toBe(3); // 10 / 3
    // What Redis last said counts when it is above the limit (a changed limit, a failover).
    const fallback = fallbackFor(2);
    fallback.lastSeen.remember([hit('b', 50)], answer(50, 58, 800), 0);
    expect(admitted(fallback, hit('b', 50), 5, 100, false)).toBe(1); // (60 - 58) / 2
    // A lone instance heard every admission Redis made (its calls on a key run in order): what
    // Redis last left is its own.
    expect(admitted(fallbackFor(1), hit('a', 5), 10, 0, false)).toBe(5);
  });

  it('forgets reset keys', () => {
    const fallback = fallbackFor(1);
    expect(admitted(fallback, hit('a'), 10, 0)).toBe(5);
    fallback.forget(['a']);
    expect(admitted(fallback, hit('a'), 10, 1)).toBe(5);
  });
});

describe('LocalFallback: penalties', () => {
  it('starts a blockFor penalty on a refusal here, which outlasts the window', () => {
    const fallback = fallbackFor(1);
    const login = { ...hit('login', 2, 1_000), blockMs: 60_000 };
    expect(admitted(fallback, login, 5, 0)).toBe(2); // 1.05 x 2: 2
    const refused = fallback.consume([login], 0, true);
    expect(refused.decisions[0].resetMs).toBe(60_000);
    expect(admitted(fallback, login, 1, 1_500)).toBe(0); // another window, still blocked
    expect(admitted(fallback, login, 1, 60_000)).toBe(1);
  });
});

/** What Redis answers for a refused hit: the window full, `resetMs` left in it. */
const refusal = (limit: number, resetMs: number): RateLimitConsumption => ({
  allowed: false,
  decisions: [{ allowed: false, limit, remaining: 0, resetMs }],
  receipts: undefined,
});

describe('LocalFallback: a slow Redis, decided at the deadline and settled by its late answers', () => {
  it('takes the units Redis admitted late for requests it refused, and no more', () => {
    const fallback = fallbackFor(3);
    const request = hit('a', 5, 2_000);
    // Three requests past their deadline: refused here (the margin of 5 on 3 instances is no unit).
    const decided = Array.from({ length: 3 }, () => fallback.consume([request], 100, false));
    expect(decided.map(({ allowed, recorded }) => ({ allowed, recorded }))).toEqual(
      Array.from({ length: 3 }, () => ({ allowed: false, recorded: false })),
    );
    // Redis runs them when its stall ends: it admits two, the window then full.
    const late = [answer(5, 4, 2_000), answer(5, 5, 2_000), refusal(5, 2_000)];
    for (const consumption of late) {
      fallback.lastSeen.remember([request], consumption, 300);
      fallback.reconcile([request], consumption, false, 300);
    }
    expect(fallback.hasBanked).toBe(true);
    // The next requests of the window, whatever decides them: two admitted, as Redis counted them.
    expect(fallback.takeBanked([request], 400)?.allowed).toBe(true);
    expect(admitted(fallback, request, 3, 500, false)).toBe(1);
    expect(fallback.takeBanked([request], 600)).toBeUndefined();
  });

  it('records what it admitted and Redis refused, and gives back to the share what both admitted', () => {
    const fallback = fallbackFor(1);
    const request = hit('a', 2, 2_000);
    // A lone instance heard every admission Redis made: what Redis left is its own, not only the margin.
    expect(admitted(fallback, request, 3, 100, false)).toBe(2);
    fallback.lastSeen.remember([request], answer(2, 1, 1_800), 300);
    fallback.reconcile([request], answer(2, 1, 1_800), true, 300); // Redis admitted it too
    fallback.reconcile([request], refusal(2, 1_800), true, 300); // Redis refused it: to record
    expect(fallback.pending.take(300).map(({ hit: { cost } }) => cost)).toEqual([1]);
    // One counted in Redis, one admitted here to record: the limit, whatever Redis answered.
    expect(admitted(fallback, request, 3, 400, false)).toBe(0);
  });

  it('lets a window banked here end with it', () => {
    const fallback = fallbackFor(3);
    const request = hit('a', 5, 1_000);
    fallback.consume([request], 100, false);
    fallback.lastSeen.remember([request], answer(5, 1, 1_000), 200);
    fallback.reconcile([request], answer(5, 1, 1_000), false, 200);
    expect(fallback.takeBanked([request], 1_200)).toBeUndefined();
    expect(fallback.hasBanked).toBe(false);
  });
});

describe('LocalFallback: a margin admission Redis admitted too', () => {
  it('gives the margin its unit back: Redis counted it within the limit', () => {
    const fallback = fallbackFor(2);
    const request = hit('a', 10, 2_000);
    expect(admitted(fallback, request, 3, 100, false)).toBe(1); // (12 - 10) / 2
    fallback.lastSeen.remember([request], answer(10, 1, 1_900), 200);
    fallback.reconcile([request], answer(10, 1, 1_900), true, 200);
    expect(admitted(fallback, request, 3, 300, false)).toBe(1);
  });
});

describe('LocalFallback: one window named by late answers read over a busy event loop', () => {
  it('keeps what it banked when the answers read a window end up to half a window apart', () => {
    const fallback = fallbackFor(3);
    const request = hit('a', 5, 2_000);
    for (let i = 0; i < 3; i += 1) fallback.consume([request], 100, false);
    // Redis answered the three together as its stall ended; a loaded loop read them 70 ms apart.
    const late: [RateLimitConsumption, number][] = [
      [answer(5, 4, 2_000), 300],
      [answer(5, 5, 2_000), 370],
      [refusal(5, 2_000), 400],
    ];
    for (const [consumption, at] of late) {
      fallback.lastSeen.remember([request], consumption, at);
      fallback.reconcile([request], consumption, false, at);
    }
    expect(admitted(fallback, request, 3, 500, false)).toBe(2);
  });
});

describe('LocalFallback: a window guessed here, then reported by Redis', () => {
  it("takes Redis's end for it, so that later reports read late still name it", () => {
    const fallback = fallbackFor(3);
    const request = hit('a', 5, 2_000);
    fallback.consume([request], 100, false); // guessed: ends at 2,100
    // Redis ran it when its stall ended, 45 ms later by its report: one window, ending at 2,145.
    fallback.lastSeen.remember([request], answer(5, 1, 2_000), 145);
    fallback.reconcile([request], answer(5, 1, 2_000), false, 145);
    // An answer on time, read 60 ms late by a busy loop: the window's end reads 2,205.
    fallback.lastSeen.remember([request], refusal(5, 2_000), 205);
    expect(fallback.takeBanked([request], 210)?.allowed).toBe(true);
  });
});

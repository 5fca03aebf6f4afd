import { describe, expect, it } from 'vitest';
import type { RateLimitDecision, RateLimitHit } from '../store/rate-limit-store.js';
import { type Lease, LeasedUnits } from './leased-units.js';

const hit = (overrides: Partial<RateLimitHit> = {}): RateLimitHit => ({
  key: 'rl:{global}:hot:fw',
  algorithm: 'fixed-window',
  limit: 1_000,
  windowMs: 60_000,
  cost: 1,
  burst: 1_000,
  blockMs: 0,
  conditional: false,
  ...overrides,
});

/** What the store answers to a grant it admits: `remaining` left, the window ending in `resetMs`. */
const admitted = (remaining: number, resetMs: number): RateLimitDecision => ({
  allowed: true,
  limit: 1_000,
  remaining,
  resetMs,
});

/** What the store answers to a request it refuses, `remaining` left before it. */
const refused = (remaining: number, resetMs: number): RateLimitDecision => ({
  allowed: false,
  limit: 1_000,
  remaining,
  resetMs,
});

/** A lease of `grant` units granted at `at` (the request that asked for it took one). */
function leased(grant: number, at = 0, resetMs = 10_000, units = new LeasedUnits(10)) {
  expect(units.take(hit(), grant, at)).toEqual({ ask: grant });
  const pending = units.asking(hit().key);
  units.granted(hit(), pending, grant, admitted(1_000 - grant, resetMs), true, at);
  pending.answer();
  return units;
}

describe('LeasedUnits', () => {
  it('admits from what it holds, then asks again; remaining counts what it holds', () => {
    const units = leased(10);
    for (let i = 8; i >= 0; i -= 1) {
      expect(units.take(hit(), 10, 1)).toMatchObject({ decided: { allowed: true, remaining: 990 + i } });
    }
    expect(units.take(hit(), 10, 1)).toEqual({ ask: 10 });
  });

  it('asks for at least the cost and at most the limit, and nothing for a free request', () => {
    const units = new LeasedUnits(10);
    expect(units.take(hit({ cost: 30 }), 10, 0)).toEqual({ ask: 30 });
    expect(units.take(hit({ limit: 5 }), 10, 0)).toEqual({ ask: 5 });
    expect(units.take(hit({ cost: 0 }), 10, 0)).toEqual({ ask: 0 });
  });

  it('never admits a unit at or after the end of the window it was granted in', () => {
    const units = leased(10, 1_000, 5_000);
    expect(units.take(hit(), 10, 5_999)).toMatchObject({ decided: { allowed: true, resetMs: 1 } });
    expect(units.take(hit(), 10, 6_000)).toEqual({ ask: 10 });
  });

  it('holds a lease only for the limit and window it was granted under', () => {
    const units = leased(10);
    expect(units.take(hit({ limit: 500 }), 10, 1)).toEqual({ ask: 10 });
    expect(units.take(hit({ windowMs: 1_000 }), 10, 1)).toEqual({ ask: 10 });
  });

  it('tells requests to wait while a grant is asked, and to ask again once it is answered', async () => {
    const units = new LeasedUnits(10);
    const pending = units.asking(hit().key);
    const take = units.take(hit(), 10, 0);
    expect(take).toEqual({ wait: pending });
    pending.answer(new Error('timed out'));
    expect(await pending.answered).toEqual(new Error('timed out'));
    expect(units.take(hit(), 10, 0)).toEqual({ ask: 10 });
  });

  it('keeps a refusal until the reset the store reported, for requests costing as much, while listening', () => {
    const deaf = new LeasedUnits(10);
    const unheard = deaf.asking(hit().key);
    deaf.granted(hit(), unheard, 10, refused(0, 4_000), false, 0);
    unheard.answer();
    expect(deaf.take(hit(), 10, 1)).toEqual({ ask: 10 });

    const units = new LeasedUnits(10);
    units.listening(true);
    const pending = units.asking(hit().key);
    // A request of cost 5 refused with 3 left: requests of 5 or more are refused here, cheaper ones ask.
    units.granted(hit({ cost: 5 }), pending, 10, refused(3, 4_000), false, 0);
    pending.answer();
    expect(units.take(hit({ cost: 5 }), 10, 3_999)).toMatchObject({
      decided: { allowed: false, remaining: 3, resetMs: 1 },
    });
    expect(units.take(hit({ cost: 1 }), 10, 3_999)).toEqual({ ask: 10 });
    expect(units.take(hit({ cost: 5 }), 10, 4_000)).toEqual({ ask: 10 });
  });

  it('keeps no refusal asked before news of resets stopped or started again', () => {
    const units = new LeasedUnits(10);
    units.listening(true);
    const before = units.asking(hit().key);
    units.listening(false);
    units.listening(true);
    units.granted(hit(), before, 10, refused(0, 4_000), false, 0);
    before.answer();
    expect(units.take(hit(), 10, 1)).toEqual({ ask: 10 });
  });

  it('drops a lease whose key was reset, and keeps nothing of a grant asked before the reset', () => {
    const units = leased(10);
    units.forget([hit().key]);
    expect(units.take(hit(), 10, 1)).toEqual({ ask: 10 });
    const pending = units.asking(hit().key);
    units.forget([hit().key]);
    const decision = units.granted(hit(), pending, 10, admitted(990, 10_000), true, 1);
    pending.answer();
    expect(decision.remaining).toBe(990);
    expect(units.take(hit(), 10, 2)).toEqual({ ask: 10 });
  });

  it('keeps held units when news stops and when it first starts; drops them when it comes back', () => {
    const units = leased(10);
    units.listening(true);
    units.listening(false);
    expect(units.take(hit(), 10, 1)).toMatchObject({ decided: { allowed: true } });
    units.listening(true);
    expect(units.take(hit(), 10, 1)).toEqual({ ask: 10 });
  });

  it('takes back units of a refused request into the lease they came from only', () => {
    const units = leased(10);
    const take = units.take(hit(), 10, 1) as { lease: Lease };
    units.giveBack(hit(), take.lease);
    let admittedHere = 0;
    while ('decided' in units.take(hit(), 10, 1)) admittedHere += 1;
    expect(admittedHere).toBe(9);
    // A lease granted since: the old one's units do not go into it.
    leased(10, 1, 10_000, units);
    units.giveBack(hit(), take.lease);
    admittedHere = 0;
    while ('decided' in units.take(hit(), 10, 2)) admittedHere += 1;
    expect(admittedHere).toBe(9);
  });
});

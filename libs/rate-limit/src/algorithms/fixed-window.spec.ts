import { describe, expect, it } from 'vitest';
import { type FixedWindowState, fixedWindowHit } from './fixed-window.js';

const hit = { key: 'k', limit: 3, windowMs: 1_000, cost: 1 };

describe('fixedWindowHit', () => {
  it('admits up to the limit in a window, counts only admitted hits, and starts over when the window ends', () => {
    let state: FixedWindowState | undefined;
    const decisions = [];
    for (const now of [0, 100, 200, 300, 999, 1_000]) {
      const step = fixedWindowHit(state, hit, now);
      state = step.state;
      decisions.push([step.decision.allowed, step.decision.remaining, step.decision.resetMs, state.count]);
    }
    expect(decisions).toEqual([
      [true, 2, 1_000, 1],
      [true, 1, 900, 2],
      [true, 0, 800, 3],
      [false, 0, 700, 3],
      [false, 0, 1, 3],
      [true, 2, 1_000, 1],
    ]);
  });

  it('rejects a cost that does not fit without consuming the remainder', () => {
    const first = fixedWindowHit(undefined, { ...hit, cost: 2 }, 0);
    const second = fixedWindowHit(first.state, { ...hit, cost: 2 }, 1);
    expect(second.decision).toMatchObject({ allowed: false, remaining: 1 });
    expect(second.state.count).toBe(2);
  });
});

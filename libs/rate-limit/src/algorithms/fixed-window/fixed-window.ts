import type { RateLimitAlgorithm } from '../algorithm.js';

/** A window that starts at the first hit and the units admitted in it. */
export interface FixedWindowState {
  start: number;
  count: number;
}

/**
 * Fixed window: `limit` units per window, the window starting at the identity's first hit. One
 * small hash per key. Up to twice the limit can pass around a window's end (the end of one window
 * and the start of the next).
 */
export const fixedWindow: RateLimitAlgorithm<FixedWindowState> = {
  name: 'fixed-window',
  step(state, { limit, windowMs, cost }, now) {
    let start = now;
    let count = 0;
    if (state && now < state.start + windowMs) {
      start = state.start;
      count = state.count;
    }
    const allowed = count + cost <= limit;
    const used = allowed ? count + cost : count;
    const resetMs = start + windowMs - now;
    return {
      allowed,
      remaining: Math.max(0, limit - used),
      resetMs,
      next: { start, count: count + cost },
      ttlMs: resetMs,
    };
  },
  refund(state, { windowMs, cost }, admittedAt) {
    if (admittedAt < state.start || admittedAt >= state.start + windowMs) return state;
    return { start: state.start, count: Math.max(0, state.count - cost) };
  },
};

import { ROUNDING_EPSILON, type RateLimitAlgorithm } from '../algorithm.js';

/** Counts of the current and the previous aligned window. */
export interface SlidingWindowState {
  /** The window length the counts were taken with; another length starts afresh. */
  windowMs: number;
  /** `floor(now / windowMs)` of the current window. */
  index: number;
  current: number;
  previous: number;
}

/**
 * Sliding window counter: the current window's count plus the previous window's count weighted by
 * how much of it the sliding window still overlaps. O(1) memory per key (one small hash).
 *
 * It assumes the previous window's hits were spread evenly. Worst case against an exact log
 * (`sliding-log`): when the previous window's hits all came at its very end, up to twice the limit
 * can pass within one window's length; when they all came at its start, it admits less than the
 * log would, by at most the previous window's count times the part of the window not yet elapsed.
 */
export const slidingWindow: RateLimitAlgorithm<SlidingWindowState> = {
  name: 'sliding-window',
  step(state, { limit, windowMs, cost }, now) {
    let index = Math.floor(now / windowMs);
    let current = 0;
    let previous = 0;
    if (state && state.windowMs === windowMs) {
      if (state.index === index || state.index === index + 1) {
        // Same window, or a clock that went back less than a window: keep counting in the stored one.
        index = state.index;
        current = state.current;
        previous = state.previous;
      } else if (state.index === index - 1) {
        previous = state.current;
      }
    }
    const elapsed = Math.max(0, now - index * windowMs);
    const estimate = (previous * (windowMs - elapsed)) / windowMs + current;
    const allowed = estimate + cost <= limit + ROUNDING_EPSILON;
    const used = allowed ? estimate + cost : estimate;
    const after = allowed ? current + cost : current;

    let resetMs: number;
    if (allowed) {
      if (after > 0) resetMs = (index + 2) * windowMs - now;
      else if (previous > 0) resetMs = (index + 1) * windowMs - now;
      else resetMs = 0;
    } else if (current + cost <= limit && previous > 0) {
      // Admitted later in this window, once the previous window's weight has fallen enough.
      const at = windowMs - ((limit - current - cost) * windowMs) / previous;
      resetMs = Math.max(0, Math.ceil(at - elapsed - ROUNDING_EPSILON));
    } else if (cost > limit || current === 0) {
      resetMs = (index + 1) * windowMs - now;
    } else {
      // Admitted in the next window, once this window's weight (as the previous one) has fallen enough.
      const at = windowMs - ((limit - cost) * windowMs) / current;
      resetMs = Math.ceil((index + 1) * windowMs + Math.max(0, at) - now - ROUNDING_EPSILON);
    }
    return {
      allowed,
      remaining: Math.max(0, Math.floor(limit - used + ROUNDING_EPSILON)),
      resetMs,
      next: { windowMs, index, current: current + cost, previous },
      ttlMs: (index + 2) * windowMs - now,
    };
  },
  refund(state, { windowMs, cost }, admittedAt) {
    if (state.windowMs !== windowMs) return state;
    const index = Math.floor(admittedAt / windowMs);
    if (state.index === index) return { ...state, current: Math.max(0, state.current - cost) };
    if (state.index === index + 1) return { ...state, previous: Math.max(0, state.previous - cost) };
    return state;
  },
};

import type { RateLimitAlgorithm } from '../algorithm.js';

/** Times of the admitted units still in the window, oldest first (one entry per unit). */
export type SlidingLogState = readonly number[];

/**
 * Sliding log: exact. Every admitted unit is kept with its time for one window; a hit is admitted
 * when the units of the last `windowMs` plus its cost fit the limit. Memory per key grows with the
 * limit (one sorted-set member per admitted unit in Redis).
 */
export const slidingLog: RateLimitAlgorithm<SlidingLogState> = {
  name: 'sliding-log',
  step(state, { limit, windowMs, cost }, now) {
    const entries = state ? state.filter((time) => time > now - windowMs) : [];
    const count = entries.length;
    const allowed = count + cost <= limit;
    let resetMs: number;
    if (allowed) {
      resetMs = windowMs;
    } else {
      // Admitted once enough of the oldest units have left the window.
      const mustLeave = count + cost - limit;
      resetMs = mustLeave > count ? windowMs : entries[mustLeave - 1] + windowMs - now;
    }
    let next = entries;
    if (cost > 0) {
      // Oldest first, as Redis orders the sorted set, even when the clock went back.
      const at = entries.findIndex((time) => time > now);
      const added = Array.from({ length: cost }, () => now);
      next = at < 0 ? [...entries, ...added] : [...entries.slice(0, at), ...added, ...entries.slice(at)];
    }
    return {
      allowed,
      remaining: Math.max(0, limit - count - (allowed ? cost : 0)),
      resetMs,
      next,
      ttlMs: Math.max(windowMs, next.length > 0 ? next[next.length - 1] + windowMs - now : 0),
    };
  },
  refund(state, { cost }, admittedAt) {
    const entries = [...state];
    for (let taken = 0, i = entries.length - 1; i >= 0 && taken < cost; i -= 1) {
      if (entries[i] === admittedAt) {
        entries.splice(i, 1);
        taken += 1;
      }
    }
    return entries;
  },
};

import type { RateLimitAlgorithm } from '../algorithm.js';

/** One admission still in the window: its time and its units. */
export interface SlidingLogEntry {
  readonly at: number;
  readonly units: number;
}

/** The admissions still in the window, oldest first (one entry per admission, whatever its cost). */
export type SlidingLogState = readonly SlidingLogEntry[];

/**
 * Sliding log: exact. Every admission is kept with its time and units for one window; a hit is
 * admitted when the units of the last `windowMs` plus its cost fit the limit. One entry per
 * admission (one sorted-set member in Redis), so a hit of any cost writes one, and memory per key
 * grows with the admissions in a window, at most the limit.
 */
export const slidingLog: RateLimitAlgorithm<SlidingLogState> = {
  name: 'sliding-log',
  step(state, { limit, windowMs, cost }, now) {
    const entries = state ? state.filter(({ at }) => at > now - windowMs) : [];
    let count = 0;
    for (const { units } of entries) count += units;
    const allowed = count + cost <= limit;
    let resetMs = windowMs;
    if (!allowed) {
      // Admitted once enough of the oldest units have left the window.
      const mustLeave = count + cost - limit;
      if (mustLeave <= count) {
        let left = 0;
        for (const { at, units } of entries) {
          left += units;
          if (left >= mustLeave) {
            resetMs = at + windowMs - now;
            break;
          }
        }
      }
    }
    let next = entries;
    if (cost > 0) {
      // Oldest first, as Redis orders the sorted set, even when the clock went back.
      const i = entries.findIndex(({ at }) => at > now);
      const added = { at: now, units: cost };
      next = i < 0 ? [...entries, added] : [...entries.slice(0, i), added, ...entries.slice(i)];
    }
    return {
      allowed,
      remaining: Math.max(0, limit - count - (allowed ? cost : 0)),
      resetMs,
      next,
      ttlMs: Math.max(windowMs, next.length > 0 ? next[next.length - 1].at + windowMs - now : 0),
    };
  },
  refund(state, { cost }, admittedAt) {
    // The admission's own entry in Redis; here, units of the same time, which decide alike.
    const entries = [...state];
    for (let owed = cost, i = entries.length - 1; i >= 0 && owed > 0; i -= 1) {
      const { at, units } = entries[i];
      if (at !== admittedAt) continue;
      const taken = Math.min(units, owed);
      owed -= taken;
      if (taken === units) entries.splice(i, 1);
      else entries[i] = { at, units: units - taken };
    }
    return entries;
  },
  renew(state, admittedAt, now) {
    // As a refund finds it: an entry of that time (units of one time decide alike).
    const i = state.findIndex(({ at }) => at === admittedAt);
    if (i < 0) return undefined;
    const { units } = state[i];
    const rest = state.filter((_, j) => j !== i);
    const after = rest.findIndex(({ at }) => at > now);
    const renewed = { at: Math.max(now, admittedAt), units };
    return after < 0 ? [...rest, renewed] : [...rest.slice(0, after), renewed, ...rest.slice(after)];
  },
};

import { MAX_WAIT_MS, ROUNDING_EPSILON, type RateLimitAlgorithm } from '../algorithm.js';

export interface GcraState {
  /** Theoretical arrival time of the next unit, in ms. */
  tat: number;
}

/**
 * GCRA (generic cell rate algorithm, as in redis-cell): one timestamp per key. Units are spaced
 * `windowMs / limit` apart; up to `burst` (default: the limit) may arrive at once. Same admissions
 * as a token bucket of capacity `burst`, with less state.
 */
export const gcra: RateLimitAlgorithm<GcraState> = {
  name: 'gcra',
  step(state, { limit, windowMs, cost, burst }, now) {
    const interval = windowMs / limit;
    const tolerance = (windowMs * burst) / limit;
    const tat = state ? Math.max(state.tat, now) : now;
    const wanted = tat + cost * interval;
    const allowAt = wanted - tolerance;
    const allowed = now + ROUNDING_EPSILON >= allowAt;
    const pending = allowed ? wanted - now : tat - now;
    // No further ahead than MAX_WAIT_MS, whatever was charged (and never back: a clock that went
    // back may have left it further).
    const nextTat = Math.max(tat, Math.min(wanted, now + MAX_WAIT_MS));
    return {
      allowed,
      remaining: Math.max(0, Math.floor((tolerance - pending) / interval + ROUNDING_EPSILON)),
      resetMs: Math.min(MAX_WAIT_MS, Math.max(0, Math.ceil((allowed ? wanted : allowAt) - now - ROUNDING_EPSILON))),
      next: { tat: nextTat },
      ttlMs: Math.max(0, Math.ceil(nextTat - now - ROUNDING_EPSILON)),
    };
  },
  refund(state, { limit, windowMs, cost }) {
    return { tat: state.tat - cost * (windowMs / limit) };
  },
};

import { ROUNDING_EPSILON, type RateLimitAlgorithm } from '../algorithm.js';

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
    const nextTat = tat + cost * interval;
    const allowAt = nextTat - tolerance;
    const allowed = now + ROUNDING_EPSILON >= allowAt;
    const pending = allowed ? nextTat - now : tat - now;
    return {
      allowed,
      remaining: Math.max(0, Math.floor((tolerance - pending) / interval + ROUNDING_EPSILON)),
      resetMs: Math.max(0, Math.ceil((allowed ? nextTat : allowAt) - now - ROUNDING_EPSILON)),
      next: { tat: nextTat },
      ttlMs: Math.max(0, Math.ceil(nextTat - now - ROUNDING_EPSILON)),
    };
  },
  refund(state, { limit, windowMs, cost }) {
    return { tat: state.tat - cost * (windowMs / limit) };
  },
};

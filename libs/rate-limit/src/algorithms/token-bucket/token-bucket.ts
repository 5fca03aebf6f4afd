import { MAX_WAIT_MS, ROUNDING_EPSILON, type RateLimitAlgorithm } from '../algorithm.js';

export interface TokenBucketState {
  tokens: number;
  refilledAt: number;
}

/**
 * Token bucket: holds up to `burst` tokens (default: the limit), refilled continuously at `limit`
 * per window; a hit takes `cost` tokens. One small hash per key. Allows bursts up to `burst`, and a
 * steady `limit` per window after that.
 */
export const tokenBucket: RateLimitAlgorithm<TokenBucketState> = {
  name: 'token-bucket',
  step(state, { limit, windowMs, cost, burst }, now) {
    const rate = limit / windowMs;
    let tokens = burst;
    let refilledAt = now;
    if (state) {
      refilledAt = Math.max(now, state.refilledAt);
      tokens = Math.min(burst, state.tokens + Math.max(0, now - state.refilledAt) * rate);
    }
    const allowed = tokens + ROUNDING_EPSILON >= cost;
    const after = allowed ? tokens - cost : tokens;
    // Ms until `units` tokens have refilled, at most MAX_WAIT_MS. Math.max also turns the -0 that
    // ceil(-epsilon) gives into 0, as Redis replies.
    const wait = (units: number) => Math.min(MAX_WAIT_MS, Math.max(0, Math.ceil(units / rate - ROUNDING_EPSILON)));
    // A debt no deeper than MAX_WAIT_MS of refill, whatever was charged.
    const kept = Math.max(tokens - cost, burst - rate * MAX_WAIT_MS);
    return {
      allowed,
      remaining: Math.max(0, Math.floor(after + ROUNDING_EPSILON)),
      resetMs: allowed ? wait(burst - after) : wait(cost - tokens),
      next: { tokens: kept, refilledAt },
      // Until the kept state refills; a clock that went back leaves refilledAt ahead of now.
      ttlMs: refilledAt - now + wait(burst - kept),
    };
  },
  refund(state, { cost, burst }) {
    return { tokens: Math.min(burst, state.tokens + cost), refilledAt: state.refilledAt };
  },
};

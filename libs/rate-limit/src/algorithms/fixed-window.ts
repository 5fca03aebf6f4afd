import type { RateLimitDecision, RateLimitHit } from '../stores/rate-limit-store.js';

/** A fixed-window counter: admitted units and when the window ends (epoch ms). */
export interface FixedWindowState {
  count: number;
  resetAt: number;
}

/**
 * One fixed-window step, the in-process twin of the Redis script: the first hit of a window starts
 * it; a hit that would pass the limit is rejected and not counted, so `count` is what was admitted.
 * Mutates and returns `state` (or a new one) so a store can keep it without copying.
 */
export function fixedWindowHit(
  state: FixedWindowState | undefined,
  hit: RateLimitHit,
  now: number,
): { state: FixedWindowState; decision: RateLimitDecision } {
  const current = state && state.resetAt > now ? state : { count: 0, resetAt: now + hit.windowMs };
  const allowed = current.count + hit.cost <= hit.limit;
  if (allowed) current.count += hit.cost;
  return {
    state: current,
    decision: {
      allowed,
      limit: hit.limit,
      remaining: Math.max(0, hit.limit - current.count),
      resetMs: current.resetAt - now,
    },
  };
}

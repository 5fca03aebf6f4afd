import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitMode } from '../rules/rate-limit-rule.js';
import { type RateLimitHit, type RateLimitStanding, capacityOf } from '../store/rate-limit-store.js';

/** An identity's counter under one rule, as `RateLimiterService.inspect` reads it (counting nothing). */
export interface RateLimitInspection {
  rule: string;
  /** As counted: a `by: 'ip'` identity as its address (an IPv6 one as its prefix), `'global'` for a global rule. */
  identity: string;
  /** The state key in the store. */
  key: string;
  /** The thresholds in force now (the config centre's, else the decorator's). */
  algorithm: RateLimitAlgorithmName;
  limit: number;
  windowMs: number;
  mode: RateLimitMode;
  /** Units counted in the current window (token-bucket and gcra: taken from the burst and not yet back). */
  used: number;
  /** Units a request could take now. */
  remaining: number;
  /** Ms until the full limit is available again (0: nothing counted). */
  resetMs: number;
  /** Ms a `blockFor` penalty has left (0: none). */
  blockedMs: number;
}

/** A counter's standing as `inspect` reports it, under the thresholds of its hit. */
export function inspection(
  rule: string,
  identity: string,
  hit: RateLimitHit,
  mode: RateLimitMode,
  standing: RateLimitStanding,
): RateLimitInspection {
  return {
    rule,
    identity,
    key: hit.key,
    algorithm: hit.algorithm,
    limit: hit.limit,
    windowMs: hit.windowMs,
    mode,
    used: Math.max(0, capacityOf(hit) - standing.remaining),
    remaining: standing.remaining,
    resetMs: standing.resetMs,
    blockedMs: standing.blockedMs,
  };
}

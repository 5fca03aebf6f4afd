import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitMode } from '../rules/rate-limit-rule.js';

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

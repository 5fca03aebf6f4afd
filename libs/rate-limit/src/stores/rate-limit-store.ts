/** One request's claim on one counter. */
export interface RateLimitHit {
  /** The full store key (prefix, rule and identity). */
  key: string;
  /** Units admitted per window. */
  limit: number;
  windowMs: number;
  /** Units this request consumes. */
  cost: number;
}

/** The same shape from every store and algorithm, so headers and `Retry-After` never differ. */
export interface RateLimitDecision {
  allowed: boolean;
  limit: number;
  /** Units still available in the current window after this request. */
  remaining: number;
  /** Milliseconds until the current window ends (and a rejected request could be admitted). */
  resetMs: number;
}

/**
 * Where counters live. A store decides one hit atomically: counting and deciding happen together,
 * and a rejected hit leaves the counter as it was.
 */
export abstract class RateLimitStore {
  /** For the startup log: what this store is and whether instances share it. */
  abstract readonly description: string;
  abstract hit(hit: RateLimitHit): Promise<RateLimitDecision>;
}

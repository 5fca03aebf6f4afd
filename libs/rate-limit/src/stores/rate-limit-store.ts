import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';

/** One rule's claim on its counter for one request. */
export interface RateLimitHit {
  /** The state key (prefix, identity as hash tag, rule, algorithm). */
  key: string;
  /** Where a `blockFor` penalty is kept; in the same hash slot as `key`. */
  blockKey: string;
  /** Fixed window: where the window's count is also kept once high (see `markFrom`); same slot. */
  markerKey: string;
  algorithm: RateLimitAlgorithmName;
  /** Units admitted per window. */
  limit: number;
  windowMs: number;
  /** Units this request consumes. */
  cost: number;
  /** Capacity of token-bucket and gcra. */
  burst: number;
  /** After a rejection by this rule, reject the identity for this long (0: no penalty). */
  blockMs: number;
  /**
   * Fixed window: from this count on, the window's count is also written to `markerKey` (kept for
   * two windows), and a window whose counter is missing resumes from it (0: no marker).
   */
  markFrom: number;
}

/** The same shape from every store and algorithm, so headers and `Retry-After` never differ. */
export interface RateLimitDecision {
  allowed: boolean;
  limit: number;
  /** Units still available after this request. */
  remaining: number;
  /** Admitted: ms until the full limit is available again. Rejected: ms until it would be admitted. */
  resetMs: number;
}

/** What a store needs to take an admitted hit back. Opaque to callers. */
export interface RateLimitReceipt {
  /** The time the hit was admitted at, on the clock that decided it. */
  readonly admittedAt: number;
  readonly nonce: string;
}

/** The decisions for all rules of one request. */
export interface RateLimitConsumption {
  /** True when every rule admitted, and so every counter moved; false when none moved. */
  allowed: boolean;
  /** One per hit, in order. */
  decisions: RateLimitDecision[];
  /** One per hit when `allowed`: what `refund` needs. */
  receipts: RateLimitReceipt[] | undefined;
  /** Redis stores: the store's time of each hit's decision (Redis `TIME`, or the given clock). */
  decidedAt?: number[];
  /** With `waitForReplicas`: false when fewer replicas than asked confirmed the counts in time. */
  replicated?: boolean;
}

/** An admitted hit to take back. */
export interface RateLimitRefund {
  hit: RateLimitHit;
  receipt: RateLimitReceipt;
}

/**
 * Where counters live. A store decides all hits of one request atomically: either every rule
 * admits and every counter moves, or the request is rejected and no counter moves.
 */
export abstract class RateLimitStore {
  /** For the startup log: what this store is and whether instances share it. */
  abstract readonly description: string;
  /**
   * @param now the time in ms from the module's `clock` option; without it the store's own clock
   *   (Redis `TIME`, so app servers with skewed clocks agree).
   */
  abstract consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption>;
  /**
   * Takes back the units of admitted hits, as far as their windows still hold them (a window that
   * has ended stays ended).
   */
  abstract refund(refunds: readonly RateLimitRefund[]): Promise<void>;
  /**
   * Counts units that were admitted without the store (by the fallback while it was out), without
   * deciding anything: counters may pass their limit.
   */
  abstract record(hits: readonly RateLimitHit[], now?: number): Promise<void>;
}

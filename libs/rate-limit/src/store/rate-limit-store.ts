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
  /**
   * A `countOn` rule: an admission stays in flight until the response settles (`settle`), and a
   * rejection caused only by units in flight is provisional: no penalty, and worth asking again.
   */
  conditional: boolean;
  /** Where a `conditional` rule's admissions in flight are kept; in the same hash slot as `key`. */
  pendingKey: string;
}

/** The same shape from every store and algorithm, so headers and `Retry-After` never differ. */
export interface RateLimitDecision {
  allowed: boolean;
  limit: number;
  /** Units still available after this request. */
  remaining: number;
  /** Admitted: ms until the full limit is available again. Rejected: ms until it would be admitted. */
  resetMs: number;
  /**
   * Rejected by a `conditional` rule only because of units still in flight, which may yet be
   * refunded: no penalty started, and the same request may be admitted once they settle.
   */
  provisional?: boolean;
  /** A key of this rule was found corrupt (another type, no number, no TTL) and mended. */
  repaired?: boolean;
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

/**
 * Units a rule leaves after its request. A rule that would admit a request another rule refused
 * reports its count as if the request were admitted; nothing of it was counted.
 */
export function remainingAfter(decision: RateLimitDecision, requestAllowed: boolean, cost: number): number {
  return !requestAllowed && decision.allowed ? decision.remaining + cost : decision.remaining;
}

/**
 * A fixed window's start on the store's clock, when the store reported its decision time: the
 * window's reset is its end, in store time. Exact however late the reply was read.
 */
export function windowStartOf(hit: RateLimitHit, consumption: RateLimitConsumption, index: number): number | undefined {
  const decidedAt = consumption.decidedAt?.[index];
  if (hit.algorithm !== 'fixed-window' || decidedAt === undefined) return undefined;
  return decidedAt + consumption.decisions[index].resetMs - hit.windowMs;
}

/** An admitted hit to take back. */
export interface RateLimitRefund {
  hit: RateLimitHit;
  receipt: RateLimitReceipt;
}

/** An admitted hit whose request has ended: its units taken back (`refund: true`) or kept. */
export interface RateLimitSettlement extends RateLimitRefund {
  refund: boolean;
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
   * Ends admitted hits: no longer in flight, and those with `refund` taken back as far as their
   * windows still hold them (a window that has ended stays ended).
   */
  abstract settle(settlements: readonly RateLimitSettlement[]): Promise<void>;
  /** Takes back the units of admitted hits: `settle` with `refund` for each. */
  refund(refunds: readonly RateLimitRefund[]): Promise<void> {
    return this.settle(refunds.map((refund) => ({ ...refund, refund: true })));
  }
  /**
   * Counts units that were admitted without the store (by the fallback while it was out), without
   * deciding anything: counters may pass their limit.
   */
  abstract record(hits: readonly RateLimitHit[], now?: number): Promise<void>;
}

import { MAX_DURATION_MS } from '../rules/duration.js';

/** The algorithms a rule can use. */
export type RateLimitAlgorithmName = 'fixed-window' | 'sliding-window' | 'sliding-log' | 'token-bucket' | 'gcra';

/** Every algorithm a rule can name, in the order the docs list them. */
export const ALGORITHM_NAMES: readonly RateLimitAlgorithmName[] = [
  'fixed-window',
  'sliding-window',
  'sliding-log',
  'token-bucket',
  'gcra',
];

/** What an algorithm needs to decide one hit. */
export interface AlgorithmParams {
  /** Units per window. */
  limit: number;
  windowMs: number;
  /** Units this hit consumes. */
  cost: number;
  /** Capacity of token-bucket and gcra (units that may arrive at once); the others ignore it. */
  burst: number;
}

/** One decision, before anything is stored. */
export interface AlgorithmStep<State> {
  allowed: boolean;
  /** Units still available after this hit (if admitted) or now (if not). */
  remaining: number;
  /**
   * Admitted: ms until the full limit is available again. Rejected: ms until this hit (same cost)
   * would be admitted, if nothing else arrives.
   */
  resetMs: number;
  /**
   * The state with this hit counted: kept when the request is admitted, and when a hit the
   * store did not see is recorded afterwards (units the fallback admitted while Redis was out).
   */
  next: State;
  /** How long `next` matters, in ms; past that, no state and stale state decide alike. */
  ttlMs: number;
}

/**
 * One algorithm in TypeScript: the embedded store's implementation, and the reference the Redis
 * scripts are tested against. `step` is pure: it never changes `state`.
 */
export interface RateLimitAlgorithm<State> {
  readonly name: RateLimitAlgorithmName;
  step(state: State | undefined, params: AlgorithmParams, now: number): AlgorithmStep<State>;
  /**
   * Takes back `params.cost` units of a hit admitted at `admittedAt` (a refund), as far as the
   * state still holds them: a window that has ended is not reopened.
   */
  refund(state: State, params: AlgorithmParams, admittedAt: number): State;
  /**
   * An admission made at `admittedAt` dated `now` instead, counting nothing more: a cap's slot kept
   * while its request runs. Undefined when the state no longer holds it. Only a sliding log, which
   * caps count with, has it.
   */
  renew?(state: State, admittedAt: number, now: number): State | undefined;
}

/**
 * Float noise allowance: added before flooring (so 2.9999999999999996 units read as 3), taken off
 * before ceiling (so 1.0000000000000009 ms reads as 1), and allowed in comparisons of fractional
 * times. The Lua scripts use the same constant, so both sides round alike.
 */
export const ROUNDING_EPSILON = 1e-9;

/**
 * The longest wait a state may hold: 365 days, the cap of windows and penalties. A token bucket's
 * debt and a GCRA arrival time go no further ahead than this, whatever was charged, so a key's TTL
 * and a `Retry-After` stay within it. The Lua scripts use the same constant.
 */
export const MAX_WAIT_MS = MAX_DURATION_MS;

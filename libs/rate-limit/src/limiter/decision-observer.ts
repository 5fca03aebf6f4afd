import type { StoreObserver } from '../resilience/deciding-store.js';
import type { ConditionalUnits, RateLimitOutcome } from './rate-limit-outcome.js';

/** What a rule did to one request, as the metric `rate_limit_decisions_total` labels it. */
export type RateLimitDecisionOutcome =
  'allowed' | 'rejected' | 'shadow_rejected' | 'fallback_allowed' | 'fallback_rejected';

/**
 * Who watches the limiter at work (the metrics of `nest-rate-limit/ops`): every store call and block
 * cache hit, told by the store stack, and every decision, told by the step it contributes.
 */
export interface DecisionObserver extends StoreObserver {
  decided(outcome: RateLimitOutcome): void;
  /** What an admitted request held until it ended (`outcome.conditional`), now settled. */
  settled(units: readonly ConditionalUnits[]): void;
}

/**
 * Injection token of the module's `DecisionObserver`, a seam the core offers: an extension provides
 * it (`rateLimitMetrics()`), and the store stack tells it of every call. Without one, nothing is
 * told and nothing is measured. @internal
 */
export const DECISION_OBSERVER = Symbol('RATE_LIMIT_DECISION_OBSERVER');

import type { RateLimitOutcome } from './rate-limit-outcome.js';

/** What a rule did to one request, as the metric `rate_limit_decisions_total` labels it. */
export type RateLimitDecisionOutcome =
  'allowed' | 'rejected' | 'shadow_rejected' | 'fallback_allowed' | 'fallback_rejected';

/** What the limiter tells metrics of every decision. */
export interface DecisionObserver {
  decided(outcome: RateLimitOutcome): void;
}

/** Injection token of the module's metrics (a `DecisionObserver`), or null without `metrics` (internal). */
export const RATE_LIMIT_METRICS = Symbol('RATE_LIMIT_METRICS');

import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { RateLimitDecision, RateLimitRefund } from '../store/rate-limit-store.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';

/** One rule's decision for one request. */
export interface RuleDecision extends RateLimitDecision {
  rule: RateLimitRule;
  identity: string;
  /** The window in force for this request (the config centre may have changed the rule's). */
  windowMs: number;
  /** Units this request asked of the rule. */
  cost: number;
  /** True when the store failed and `onStoreError` decided; such decisions send no `RateLimit-*` headers. */
  fallback: boolean;
}

/** What the guard decided for a request, kept on the request for the interceptor. */
export interface RateLimitOutcome {
  decisions: readonly RuleDecision[];
  /** The decision that sets the headers: the rejecting rule with the longest wait, else the tightest rule. */
  reported: RuleDecision | undefined;
  allowed: boolean;
  /** Admitted units of rules with `countOn` other than `'all'`, to refund when the response ends. */
  conditional: readonly ConditionalUnits[];
  /** Set when the store failed and this policy decided the request. */
  storeError?: RateLimitStoreErrorPolicy;
}

/** Units that stay counted only if the response ends as `countOn` says. */
export interface ConditionalUnits {
  countOn: 'success' | 'failure';
  refund: RateLimitRefund;
}

const OUTCOME = Symbol('rate-limit:outcome');

type WithOutcome = { [OUTCOME]?: RateLimitOutcome };

export function outcomeOf(request: object): RateLimitOutcome | undefined {
  return (request as WithOutcome)[OUTCOME];
}

export function attachOutcome(request: object, outcome: RateLimitOutcome): void {
  (request as WithOutcome)[OUTCOME] = outcome;
}

export function retryAfterSeconds(decision: RateLimitDecision): number {
  return Math.max(1, Math.ceil(decision.resetMs / 1000));
}

import type { RateLimitMode, RateLimitRule } from '../rules/rate-limit-rule.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';
import type { RateLimitDecision, RateLimitRefund } from '../store/rate-limit-store.js';

/** One rule's decision for one request. */
export interface RuleDecision extends RateLimitDecision {
  rule: RateLimitRule;
  identity: string;
  /** The window in force for this request (the config centre may have changed the rule's). */
  windowMs: number;
  /** Units this request asked of the rule. */
  cost: number;
  /**
   * True when the store failed and the rule's store-error policy decided (`'local'`, `'allow'` or
   * `'deny'`; `RateLimitOutcome.storeError` says which): such decisions send no `RateLimit-*` headers.
   */
  fallback: boolean;
  /**
   * The rule's mode for this request. A `'shadow'` decision never refuses the request: one with
   * `allowed: false` is a would-be rejection. Shadowed rules send no headers.
   */
  mode: RateLimitMode;
}

/** What the limiter decided for a request. */
export interface RateLimitOutcome {
  decisions: readonly RuleDecision[];
  /**
   * The decision that sets the headers: the rejecting rule with the longest wait, else the tightest
   * rule the store decided (none when the fallback decided every rule of an admitted request).
   */
  reported: RuleDecision | undefined;
  allowed: boolean;
  /** Admitted units of rules with `countOn` other than `'all'`, to settle when the response ends. */
  conditional: readonly ConditionalUnits[];
  /** Set when the store failed and this policy decided the request. */
  storeError?: RateLimitStoreErrorPolicy;
}

/** Units that stay counted only if the response ends as `countOn` says. */
export interface ConditionalUnits {
  countOn: 'success' | 'failure';
  refund: RateLimitRefund;
}

/** Picks the decision the headers report: the rejecting rule with the longest wait, else the tightest rule. */
export function rateLimitOutcome(
  decisions: readonly RuleDecision[],
  allowed: boolean,
  conditional: readonly ConditionalUnits[],
  storeError?: RateLimitStoreErrorPolicy,
): RateLimitOutcome {
  let reported: RuleDecision | undefined;
  for (const decision of decisions) {
    if ((decision.fallback && allowed) || decision.mode === 'shadow') continue;
    if (!allowed) {
      if (!decision.allowed && (!reported || decision.resetMs > reported.resetMs)) reported = decision;
    } else if (!reported || tighter(decision, reported)) {
      reported = decision;
    }
  }
  const outcome: RateLimitOutcome = { decisions, reported, allowed, conditional };
  if (storeError) outcome.storeError = storeError;
  return outcome;
}

function tighter(a: RuleDecision, b: RuleDecision): boolean {
  return a.remaining < b.remaining || (a.remaining === b.remaining && a.resetMs > b.resetMs);
}

/** Whole seconds until a rejected request would be admitted; at least 1. */
export function retryAfterSeconds(decision: RateLimitDecision): number {
  return Math.max(1, Math.ceil(decision.resetMs / 1000));
}

import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import { type ExemptionProblems, skips } from '../exemptions.js';
import type { LimitedRequest } from '../limited-request.js';
import type { LimiterStep, Prepare } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { Thresholds } from '../rule-thresholds.js';

/**
 * Rules with `skipIf`: a request it skips is not counted by the rule, and the rule's resolvers do
 * not run for it. Work outside HTTP has no request to ask about: it is counted.
 */
export class SkipIfStep implements LimiterStep {
  constructor(private readonly problems: ExemptionProblems) {}

  prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
    request: LimitedRequest | undefined,
  ): PreparedRule | null | Promise<PreparedRule | null> {
    if (!request || !rule.skipIf) return next(rule, thresholds);
    const skipped = skips(rule.skipIf, request, ruleSubject(rule), this.problems);
    if (skipped === false) return next(rule, thresholds);
    if (skipped === true) return null;
    return skipped.then((skip) => (skip ? null : next(rule, thresholds)));
  }
}

/** How messages name a rule: where it is declared, and its name where that says more. */
function ruleSubject(rule: RateLimitRule): string {
  return rule.name === rule.declaredOn
    ? `@RateLimit on ${rule.declaredOn}`
    : `@RateLimit on ${rule.declaredOn} (rule '${rule.name}')`;
}

import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitNearLimitEvent, RateLimitOutcome, RuleDecision } from '../rate-limit-outcome.js';

/**
 * Rules with `nearLimit`: an admission that takes an identity's use to the share or past it, from
 * below it, is flagged (`decision.nearLimit`, which metrics count) and told to the module's
 * `onNearLimit`. Only what the store decided: the fallback's figures are this instance's guess.
 */
export class NearLimitStep implements LimiterStep {
  /** @param onNearLimit the module's, made never to throw into a request; none: flagged only. */
  constructor(private readonly onNearLimit: ((event: RateLimitNearLimitEvent) => void) | undefined) {}

  decided(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void {
    if (!outcome.allowed || !consumption || consumption.storeError !== undefined) return;
    outcome.decisions.forEach((decision, i) => {
      const share = prepared[i]?.rule.nearLimit;
      if (share === undefined || !crossed(share, decision)) return;
      decision.nearLimit = true;
      const { limit, remaining, resetMs } = decision;
      this.onNearLimit?.({ rule: decision.rule.name, identity: decision.identity, limit, remaining, resetMs });
    });
  }
}

/** Whether an admission took use (of `limit`) to the `share` or past it, from below it. */
function crossed(share: number, { limit, remaining, cost }: RuleDecision): boolean {
  const threshold = Math.ceil(share * limit);
  const used = limit - remaining;
  return used >= threshold && used - cost < threshold;
}

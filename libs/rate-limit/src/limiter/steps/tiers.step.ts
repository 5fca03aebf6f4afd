import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import { describeValue } from '../../rules/describe-value.js';
import type { LimitedRequest } from '../limited-request.js';
import type { LimiterStep, Prepare, StepKit } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import { type Thresholds, Warnings } from '../rule-thresholds.js';

/**
 * Rules with `tiers`: a request is counted under the rule of the tier its `tiers.of` names
 * (its own thresholds and counters), else under the rule's own. Outside HTTP, under the rule's own.
 */
export class TiersStep implements LimiterStep {
  private readonly warnings = new Warnings();

  constructor(private readonly kit: StepKit) {}

  async prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
    request: LimitedRequest | undefined,
  ): Promise<PreparedRule | null> {
    if (!request || !rule.tiers) return next(rule, thresholds);
    const counted = await this.tierOf(rule, request);
    if (counted === rule) return next(rule, thresholds);
    const inForce = this.kit.thresholdsOf(counted);
    return inForce.mode === 'off' ? null : next(counted, inForce);
  }

  /** The rule of the tier a request is counted under: its `tiers.of`'s, else the rule's own. */
  private async tierOf(rule: RateLimitRule, request: LimitedRequest): Promise<RateLimitRule> {
    const name: unknown = await rule.tier!(request.context);
    if (name === undefined || name === null || name === '') return rule;
    const tier = typeof name === 'string' ? rule.tiers!.get(name) : undefined;
    if (tier) return tier;
    this.warnings.once(
      `tier:${rule.declaredOn}:${rule.name}:${String(name).slice(0, 40)}`,
      `@RateLimit on ${rule.declaredOn}: 'tiers.of' returned ${describeValue(name, 40)}, which is not one of its tiers (${[...rule.tiers!.keys()].join(', ')}); such requests get the rule's own count (${rule.count} per ${rule.windowMs} ms)`,
    );
    return rule;
  }
}

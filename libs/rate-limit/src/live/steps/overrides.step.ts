import type { IdentityControls } from '../../limiter/rate-limit-config-centre.js';
import type { LimitedRequest } from '../../limiter/limited-request.js';
import type { LimiterStep, Prepare, StepKit } from '../../limiter/limiter-step.js';
import type { PreparedRule } from '../../limiter/prepare-hits.js';
import type { Thresholds } from '../../limiter/rule-thresholds.js';
import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import { ANONYMOUS_IDENTITY } from '../../store/key-layout.js';

/**
 * Per-identity overrides (`RateLimitManagementService.setOverride`): an identity with values of its
 * own for a rule's config key, for a while, is counted under them (over the centre's for the key).
 * Without overrides, it asks nothing.
 */
export class OverridesStep implements LimiterStep {
  constructor(
    private readonly controls: IdentityControls,
    private readonly kit: StepKit,
  ) {}

  prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
    _request: LimitedRequest | undefined,
  ): PreparedRule | null | Promise<PreparedRule | null> {
    const prepared = next(rule, thresholds);
    if (!this.controls.anyOverrides) return prepared;
    return prepared instanceof Promise ? prepared.then((p) => this.overridden(p)) : this.overridden(prepared);
  }

  private overridden(prepared: PreparedRule | null): PreparedRule | null {
    if (!prepared) return null;
    const { rule, identity } = prepared;
    if (rule.configKey === undefined || identity === ANONYMOUS_IDENTITY) return prepared;
    const values = this.controls.overrideOf(rule.configKey, identity, this.kit.now());
    return values ? this.kit.withThresholds(prepared, this.kit.thresholdsWith(rule, values)) : prepared;
  }
}

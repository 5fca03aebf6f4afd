import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { SampledLogger } from '../../logging/sampled-logger.js';
import { EVERY_RULE } from '../rate-limit-config-centre.js';
import type { LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitOutcome } from '../rate-limit-outcome.js';

/**
 * The module's `logging`: refusals logged by sampling, never a line each (an attack must not fill
 * the disks). Shadow lines are sampled apart, so trying a limit never hides an enforced one's
 * lines. A refusal the fallback decided is not one: the store-problem log says why.
 */
export class RejectionLogStep implements LimiterStep {
  constructor(private readonly log: SampledLogger) {}

  refused(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void {
    if (outcome.banned) return this.banned(outcome);
    if (!consumption || consumption.storeError !== undefined) return;
    outcome.decisions.forEach((decision, i) => {
      if (decision.allowed) return;
      const { hit } = prepared[i];
      const shadow = decision.mode === 'shadow';
      this.log.record(
        shadow ? `shadow:${hit.key}` : hit.key,
        () =>
          `${shadow ? 'Would reject (shadow mode)' : 'Rejected'} by rule ${decision.rule.name} (${hit.limit} per ${hit.windowMs} ms, ${hit.algorithm}), key ${hit.key}`,
      );
    });
  }

  close(): void {
    this.log.close();
  }

  private banned({ reported, bannedUnder }: RateLimitOutcome): void {
    const { rule, identity } = reported!;
    this.log.record(
      `ban:${rule.name}:${identity}`,
      () =>
        `Refused a banned identity ${identity} (${bannedUnder === EVERY_RULE ? 'every rule' : `rule ${rule.name}`})`,
    );
  }
}

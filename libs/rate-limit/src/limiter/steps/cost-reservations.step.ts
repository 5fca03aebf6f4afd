import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitOutcome, ReservedUnits } from '../rate-limit-outcome.js';
import { heldUnits } from './held-units.js';

/**
 * Rules with `settleCost`: an admitted request's reservation (its `cost`) is left in the outcome
 * (`outcome.reserved`), to be settled against what it really cost (`RateLimiterService.settleCost`).
 */
export class CostReservationsStep implements LimiterStep {
  decided(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void {
    const reserved = heldUnits(
      prepared,
      consumption,
      (rule) => rule.settleCost !== undefined,
      (rule, refund): ReservedUnits => ({ rule, refund }),
    );
    if (reserved) outcome.reserved = reserved;
  }
}

import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { LimitedRequest } from '../limited-request.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { ConditionalUnits, RateLimitOutcome } from '../rate-limit-outcome.js';
import { CountOnWaits } from './count-on-waits.js';
import { heldUnits } from './held-units.js';

/**
 * Rules with `countOn`: a request turned away only by admissions still in flight waits for them
 * to settle (`CountOnWaits`); an admitted one leaves its units to settle by how it ends
 * (`outcome.conditional`, which the guard or the caller of `consume` settles).
 */
export class CountOnStep implements LimiterStep {
  private readonly waits: CountOnWaits;

  constructor(inFlightWaitMs: number) {
    this.waits = new CountOnWaits(inFlightWaitMs);
  }

  consume(
    prepared: readonly PreparedRule[],
    next: Consume,
    request: LimitedRequest | undefined,
  ): Promise<ResilientConsumption> {
    if (!prepared.some((p) => p.hit.conditional)) return next(prepared);
    // A request whose client left while it waited stops waiting; work outside HTTP has no client.
    return this.waits.decide(prepared, () => next(prepared), request ? () => request.gone() : neverGone);
  }

  decided(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void {
    const conditional = heldUnits(
      prepared,
      consumption,
      (rule) => rule.countOn !== 'all',
      (rule, refund): ConditionalUnits => ({ rule, countOn: rule.countOn as 'success' | 'failure', refund }),
    );
    if (conditional) outcome.conditional = conditional;
  }

  /** Wakes the requests waiting on those keys' units. */
  released(keys: readonly string[]): void {
    this.waits.settled(keys);
  }
}

function neverGone(): boolean {
  return false;
}

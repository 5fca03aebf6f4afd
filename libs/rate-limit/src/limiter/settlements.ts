import { describeError } from '../logging/describe-error.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import type { DecidingStore } from '../resilience/deciding-store.js';
import { type RateLimitRefund, type RateLimitSettlement, holdsInFlight } from '../store/rate-limit-store.js';
import type { LimiterSteps } from './limiter-steps.js';
import { Warnings } from './rule-thresholds.js';
import type { RateLimitOutcome } from './rate-limit-outcome.js';

/**
 * Ends what admitted requests hold until they are done: units in flight by `countOn`
 * (`RateLimiterService.settle`) and reservations by `settleCost` (`settleCost`). Taken only by
 * outcomes that hold some, so other requests never reach it. Where the local fallback admitted the
 * request (the store out), the store layers settle it there.
 */
export class Settlements {
  private readonly warnings = new Warnings();
  /** Outcomes settled already: settled again (a caller's second `settle`), they give back nothing more. */
  private readonly settled = new WeakSet<RateLimitOutcome>();

  constructor(
    private readonly store: DecidingStore,
    private readonly problems: StoreProblemLog,
    private readonly steps: LimiterSteps,
    private readonly now: () => number | undefined,
  ) {}

  /**
   * `countOn` units no longer in flight, and refunded for rules whose `countOn` the response did not
   * meet; caps' slots given back; requests waiting on them are woken. Never throws: a failed call leaves them counted (logged).
   */
  async countOn(settled: RateLimitOutcome, succeeded: boolean): Promise<void> {
    // A second refund would take units another request holds (a slot given back twice, say).
    if (this.settled.has(settled)) return;
    this.settled.add(settled);
    const settlements = settled.conditional.map(({ countOn, refund }) => ({
      ...refund,
      refund: countOn === 'release' || (countOn === 'success') !== succeeded,
    }));
    try {
      await this.store.settle(settlements);
    } catch (error) {
      const reason = describeError(error);
      this.problems.report(`refund:${reason}`, `Settling countOn units failed (${reason}); they stay counted`);
    } finally {
      this.steps.released(
        settlements.map(({ hit }) => hit.key),
        'settled',
        settled.conditional,
      );
    }
  }

  /**
   * Each `settleCost` rule's reservation against the real cost: less is refunded, more charged past
   * the limit if need be, in the call that ends the admission's claim in flight. Never throws: a
   * failed call leaves the reservations counted (logged), an invalid cost too (said once).
   */
  async cost(outcome: RateLimitOutcome, actual: number | Readonly<Record<string, number>>): Promise<void> {
    const { reserved } = outcome;
    if (reserved.length === 0) return;
    // Each ends its claim in flight: a refund, or the reservation kept, by `settle`; a charge by itself.
    const settlements: RateLimitSettlement[] = [];
    const charges: RateLimitRefund[] = [];
    for (const { rule, refund } of reserved) {
      const { hit, receipt } = refund;
      let units = typeof actual === 'number' ? actual : actual[rule.name];
      if (!Number.isSafeInteger(units) || units < 0) {
        this.warnings.once(
          `settleCost:${rule.declaredOn}:${rule.name}`,
          `@RateLimit on ${rule.declaredOn}: the cost settled (${String(units)}) is not a whole number >= 0 (or settleCost threw); the reservation of ${hit.cost} stays`,
        );
        units = hit.cost;
      } else if (hit.overdraftBound !== undefined && units > hit.cost + hit.overdraftBound) {
        this.warnings.once(
          `maxCost:${rule.declaredOn}:${rule.name}`,
          `@RateLimit on ${rule.declaredOn}: a request cost ${units}, more than it was held at (its settleCost.max, or its reservation where that was more: ${hit.cost + hit.overdraftBound}); charged in full, but requests in flight together may overdraw the budget by more than one request's overdraft`,
        );
      }
      const difference = units - hit.cost;
      if (difference > 0) charges.push({ hit: { ...hit, cost: difference }, receipt });
      // Exactly the reservation, and no claim to end: nothing to tell the store.
      else if (difference < 0 || holdsInFlight(hit)) {
        settlements.push({ hit: { ...hit, cost: -difference }, receipt, refund: difference < 0 });
      }
    }
    try {
      await Promise.all([
        settlements.length > 0 ? this.store.settle(settlements) : undefined,
        charges.length > 0 ? this.store.charge(charges, this.now()) : undefined,
      ]);
    } catch (error) {
      const reason = describeError(error);
      this.problems.report(`settleCost:${reason}`, `Settling costs failed (${reason}); the reservations stay counted`);
    }
  }
}

import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { LeasingStore } from '../../resilience/leasing.store.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';

/**
 * Rules with `lease`: a request with such a rule is decided by the store with leases on top
 * (`LeasingStore`), which takes units this instance holds; the others go to the store as ever.
 */
export class LeasesStep implements LimiterStep {
  /** @param now the time of the calls: the module's clock, or none for the store's own. */
  constructor(
    private readonly leasing: LeasingStore,
    private readonly now: () => number | undefined,
  ) {}

  consume(prepared: readonly PreparedRule[], next: Consume): Promise<ResilientConsumption> {
    if (!prepared.some((p) => p.rule.lease > 0)) return next(prepared);
    return this.leasing.consume(
      prepared.map((p) => p.hit),
      prepared.map((p) => p.rule),
      this.now(),
    );
  }

  /** A reset drops the units leased here at once (the store tells every instance of it, this one too). */
  released(keys: readonly string[], how: 'reset' | 'settled'): void {
    if (how === 'reset') this.leasing.forgetLeases(keys);
  }
}

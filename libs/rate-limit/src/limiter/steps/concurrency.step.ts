import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import { SLOT_LEASE_MS } from '../../rules/concurrency-cap.js';
import type { RateLimitStore } from '../../store/rate-limit-store.js';
import type { StoreProblemLog } from '../../logging/store-problem-log.js';
import { describeError } from '../../logging/describe-error.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { ConditionalUnits, RateLimitOutcome } from '../rate-limit-outcome.js';
import { heldUnits } from './held-units.js';

/**
 * What a cap's refusal and headers say to wait: a slot comes back when any request in flight ends,
 * which no time foretells, so a client is told to try again in a second (not the slot's lease).
 */
export const CAP_RETRY_MS = 1_000;

/**
 * Rules with `concurrency`: each admission holds a slot of its cap (an entry of a sliding log as
 * long as the lease), given back when its request ends however it ends (`outcome.conditional`,
 * `'release'`, which the guard, the interceptor or the caller of `consume` settles). While a request
 * runs its slot is renewed, every third of the lease, so only a crashed instance's slots run out.
 */
export class ConcurrencyStep implements LimiterStep {
  /** Slots of requests in flight here, the store's (not the local fallback's). */
  private readonly held = new Set<ConditionalUnits>();
  private timer: ReturnType<typeof setInterval> | undefined;

  /**
   * @param store renews the slots (`renewSlots`); the store itself, under the layers that decide
   * @param now the time of the calls: the module's clock, or none for the store's own
   */
  constructor(
    private readonly store: RateLimitStore,
    private readonly problems: StoreProblemLog,
    private readonly now: () => number | undefined,
  ) {}

  async consume(prepared: readonly PreparedRule[], next: Consume): Promise<ResilientConsumption> {
    const consumption = await next(prepared);
    if (!prepared.some(({ hit }) => hit.slot)) return consumption;
    const decisions = consumption.decisions.map((decision, i) =>
      prepared[i].hit.slot ? { ...decision, resetMs: Math.min(decision.resetMs, CAP_RETRY_MS) } : decision,
    );
    return { ...consumption, decisions };
  }

  decided(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void {
    const slots = heldUnits(
      prepared,
      consumption,
      (rule) => rule.concurrency !== undefined,
      (rule, refund): ConditionalUnits => ({ rule, countOn: 'release', refund }),
    );
    if (!slots) return;
    outcome.conditional = outcome.conditional.length === 0 ? slots : [...outcome.conditional, ...slots];
    // Only slots the store holds are renewed: not those the local fallback took while it was out.
    if (consumption?.storeError) return;
    for (const slot of slots) this.held.add(slot);
    this.timer ??= setInterval(() => void this.renew(), SLOT_LEASE_MS / 3).unref();
  }

  released(_keys: readonly string[], _how: 'reset' | 'settled', units?: readonly ConditionalUnits[]): void {
    if (!units) return;
    for (const unit of units) this.held.delete(unit);
  }

  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /**
   * Dates every slot held now: each is renewed within a third of the lease of being taken, and then
   * every third, so one failed renewal costs none. A slot the store no longer holds is let go.
   */
  private async renew(): Promise<void> {
    const slots = [...this.held];
    if (slots.length === 0) {
      this.close();
      return;
    }
    try {
      const times = await this.store.renewSlots(
        slots.map(({ refund }) => refund),
        this.now(),
      );
      slots.forEach((slot, i) => {
        const at = times[i];
        if (at === undefined) this.held.delete(slot);
        // Ended meanwhile: its settlement took the receipt it had, which the store still finds.
        else if (this.held.has(slot))
          slot.refund = { ...slot.refund, receipt: { ...slot.refund.receipt, admittedAt: at } };
      });
    } catch (error) {
      // Kept, and tried again next tick: a slot outlives a missed renewal.
      const reason = describeError(error);
      this.problems.report(`renew:${reason}`, `Renewing concurrency slots failed (${reason}); tried again shortly`);
    }
  }
}

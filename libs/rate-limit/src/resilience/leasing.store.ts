import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitReceipt,
  unaskedDecision,
} from '../store/rate-limit-store.js';
import {
  type DecidingStore,
  DecidingStoreLayer,
  type HitHandling,
  type ResilientConsumption,
} from './deciding-store.js';
import type { Lease, LeasedUnits, PendingGrant } from './leased-units.js';

/**
 * How often one leased request goes round: waiting for another request's grant, or asking again for
 * the units left after a grant too big for them. Then it asks the store for its own units alone.
 */
const LEASED_ATTEMPTS = 6;

/** The receipt of units admitted from a lease: never settled (leases exclude `countOn`). */
const LEASED = { admittedAt: 0, nonce: 'lease' } as const;

/**
 * Leases as a layer (`LeasedUnits`): the requests of rules with `lease` take units this instance
 * holds, and the store is asked once per lease instead of once per request. The limiter sends it
 * only requests with such a rule; the module wires it only for a store that tells every instance
 * of lowered counts (a reset anywhere must drop the units leased here).
 */
export class LeasingStore extends DecidingStoreLayer {
  /**
   * @param leases told by the store of the keys any instance lowered (the module wires that).
   * @param clock the module's `clock`, if it has one: the time of the calls.
   */
  constructor(
    inner: DecidingStore,
    private readonly leases: LeasedUnits,
    private readonly clock: (() => number) | undefined,
  ) {
    super(inner);
  }

  attempt(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption> {
    return this.consume(hits, rules, now);
  }

  reset(keys: readonly string[]): Promise<void> {
    this.forgetLeases(keys);
    return this.inner.reset(keys);
  }

  /** Drops the units leased here of these keys (reset through the store below this layer). */
  forgetLeases(keys: readonly string[]): void {
    this.leases.forget(keys);
  }

  /**
   * Hits of leased rules take their units from this instance's lease where it holds them; the rest,
   * and the grants of new leases, go to the store in one call. A request is admitted on every rule
   * or on none: units taken from a lease for a request another rule refuses go back to it.
   */
  async consume(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    given: number | undefined,
  ): Promise<ResilientConsumption> {
    const { leases, clock } = this;
    /** Per key, the most a grant may ask: what the store said was left after a bigger ask. */
    let caps: Map<string, number> | undefined;
    for (let attempt = 1; ; attempt += 1) {
      // Read again on every pass: a lease must not be used on a time from before a wait.
      const now = attempt > 1 && clock ? Math.floor(clock()) : given;
      const sentAt = now ?? performance.now();
      const leasing = attempt < LEASED_ATTEMPTS;
      const decisions: RateLimitDecision[] = [];
      const taken: { hit: RateLimitHit; lease: Lease }[] = [];
      const asked: RateLimitHit[] = [];
      const askedRules: HitHandling[] = [];
      const askedFor: { index: number; grant: number }[] = [];
      let wait: PendingGrant | undefined;
      let refusedHere = false;
      hits.forEach((hit, index) => {
        const size = leasing ? rules[index].lease : 0;
        if (size === 0) {
          asked.push(hit);
          askedRules.push(rules[index]);
          askedFor.push({ index, grant: 0 });
          return;
        }
        const take = leases.take(hit, size, sentAt);
        if ('decided' in take) {
          decisions[index] = take.decided;
          if (take.lease) taken.push({ hit, lease: take.lease });
          if (!take.decided.allowed) refusedHere = true;
        } else if ('wait' in take) {
          wait ??= take.wait;
        } else {
          const grant = Math.max(hit.cost, Math.min(take.ask, caps?.get(hit.key) ?? take.ask));
          asked.push(grant === hit.cost ? hit : { ...hit, cost: grant });
          askedRules.push(rules[index]);
          askedFor.push({ index, grant: grant === hit.cost ? 0 : grant });
        }
      });
      const giveBack = () => {
        for (const { hit, lease } of taken) leases.giveBack(hit, lease);
      };
      if (refusedHere) {
        giveBack();
        // As the block cache answers: the rules not asked read as admitting with their full limit.
        hits.forEach((hit, i) => {
          decisions[i] ??= unaskedDecision(hit);
        });
        return { allowed: false, decisions, receipts: undefined };
      }
      if (wait) {
        giveBack();
        // The grant's failure is this request's too: one deadline for all that wait, not one each.
        const error = await wait.answered;
        if (error !== undefined) return this.inner.decideFailed(hits, rules, error, now, true);
        continue;
      }
      if (asked.length === 0) return { allowed: true, decisions, receipts: hits.map(() => LEASED) };

      const grants = askedFor.map(({ index, grant }) => (grant > 0 ? leases.asking(hits[index].key) : undefined));
      let consumption: RateLimitConsumption;
      try {
        consumption = await this.inner.attempt(asked, askedRules, now);
      } catch (error) {
        giveBack();
        for (const grant of grants) grant?.answer(error);
        return this.inner.decideFailed(hits, rules, error, now);
      }
      let retry = !consumption.allowed && leasing;
      /** Grants refused only for their size, in a refused request: what each would do at its own cost. */
      const tooBig: number[] = [];
      const receipts: RateLimitReceipt[] = hits.map(() => LEASED);
      askedFor.forEach(({ index, grant }, j) => {
        const hit = hits[index];
        let decision = consumption.decisions[j];
        const pending = grants[j];
        if (pending) {
          decision = leases.granted(hit, pending, grant, decision, consumption.allowed, sentAt);
          if (!decision.allowed && decision.remaining >= hit.cost) {
            // Refused only for the size of the grant: ask again for what is left.
            (caps ??= new Map()).set(hit.key, decision.remaining);
            tooBig.push(index);
          } else if (!decision.allowed) {
            retry = false;
          } else if (!consumption.allowed) {
            // As if admitted, by the request's own cost (`remainingAfter`): the grant was not its cost.
            decision = { ...decision, remaining: decision.remaining + grant - hit.cost };
          }
        } else if (!decision.allowed) {
          retry = false;
        }
        decisions[index] = decision;
        if (consumption.receipts) receipts[index] = consumption.receipts[j];
      });
      for (const grant of grants) grant?.answer();
      if (consumption.allowed) return { allowed: true, decisions, receipts };
      giveBack();
      if (retry) continue;
      // Another rule refused: a rule that would admit the request at its own cost says so.
      for (const index of tooBig) {
        const { remaining, ...rest } = decisions[index];
        decisions[index] = { ...rest, allowed: true, remaining: remaining - hits[index].cost };
      }
      return { allowed: false, decisions, receipts: undefined };
    }
  }
}

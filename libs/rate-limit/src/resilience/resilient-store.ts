import { type StoreProblemLog, describeError } from '../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitStanding,
  type RateLimitReceipt,
  type RateLimitSettlement,
  type RateLimitStore,
  unaskedDecision,
} from '../store/rate-limit-store.js';
import { BlockedKeys } from './blocked-keys.js';
import { KeysInFlight } from './keys-in-flight.js';
import { type Lease, LeasedUnits, type PendingGrant } from './leased-units.js';
import { LocalFallback, type LocalFallbackOptions } from './local-fallback.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

/** Retry-After for requests refused because the store failed under the policy `'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

export interface ResilienceOptions {
  /** The module's `storeErrors.policy`, for hits whose rule names none. */
  policy: RateLimitStoreErrorPolicy;
  localFallback: LocalFallbackOptions;
  /** Keys refused kept at most (`BlockedKeys`), or false for none. */
  blockCache: { maxKeys: number } | false;
  /** Keys whose leased units are held at most (`LeasedUnits`). */
  leaseKeys: number;
  /** The module's `clock`, if it has one: the time of the calls. */
  clock?: () => number;
  /** Told of every store call and what spared one (metrics); none: nothing is timed. */
  observer?: StoreObserver;
}

/** What metrics learn of the store as the limiter uses it. */
export interface StoreObserver {
  /** A consume call ended, after `seconds`; `error` when it failed. */
  called(seconds: number, error: unknown): void;
  /** Refused by the block cache, without a store call. */
  blockCacheHit(): void;
}

/** What of a hit's rule the store as the limiter uses it needs: a `RateLimitRule` is one. */
export interface HitHandling {
  /** The rule's own store-error policy, if it names one. */
  readonly onStoreError: RateLimitStoreErrorPolicy | undefined;
  /** Units taken from a shared store at once (`LeasedUnits`); 0: none. */
  readonly lease: number;
}

/** A consumption, and when the store failed, the policy that decided it instead. */
export interface ResilientConsumption extends RateLimitConsumption {
  storeError?: RateLimitStoreErrorPolicy;
}

/**
 * How often one leased request goes round: waiting for another request's grant, or asking again for
 * the units left after a grant too big for them. Then it asks the store for its own units alone.
 */
const LEASED_ATTEMPTS = 6;

/** The receipt of units admitted from a lease: never settled (leases exclude `countOn`). */
const LEASED = { admittedAt: 0, nonce: 'lease' } as const;

/**
 * The store as the limiter uses it: the configured store, and around a shared one (Redis) what
 * keeps requests decided while it fails, and what spares it calls (the block cache, leases). A
 * failed call (an error, a missed deadline, an open circuit) is decided by each rule's store-error
 * policy (its `onStoreError`, else the module's `storeErrors.policy`): `'deny'` refuses, `'allow'`
 * admits, and `'local'` rules are decided together by the local fallback, from what the store last
 * reported. Once the store answers again, what the fallback admitted meanwhile is recorded in it.
 *
 * A store in this process (`shared: false`) has no fallback and nothing to record: should it fail,
 * `'local'` rules admit as `'allow'` ones do. It needs no block cache and no leases either.
 */
export class ResilientStore {
  private readonly fallback: LocalFallback | undefined;
  private readonly blocked: BlockedKeys | undefined;
  /** With the block cache: calls of one key held while those in flight may reach its limit. */
  private readonly inFlight: KeysInFlight | undefined;
  private readonly leases: LeasedUnits | undefined;

  constructor(
    private readonly store: RateLimitStore,
    private readonly problems: StoreProblemLog,
    private readonly options: ResilienceOptions,
  ) {
    if (!store.shared) return;
    this.fallback = new LocalFallback(options.localFallback);
    const leases = new LeasedUnits(options.leaseKeys);
    const blocked = options.blockCache ? new BlockedKeys(options.blockCache.maxKeys) : undefined;
    // Refusals are kept only if every instance's resets and refunds reach this one, so none stays
    // refused here; and a reset anywhere drops the units it took from a lease here.
    const watching = store.watchLiftedKeys({
      lifted: (keys) => {
        blocked?.forget(keys);
        leases.forget(keys);
      },
      listening: (on) => {
        blocked?.listening(on);
        leases.listening(on);
      },
    });
    // Without that news a reset elsewhere could not drop the units held here: no leases then.
    if (watching) {
      this.blocked = blocked;
      this.inFlight = blocked ? new KeysInFlight() : undefined;
      this.leases = leases;
    }
  }

  get description(): string {
    return this.store.description;
  }

  /**
   * @param rules what each hit's rule asks beyond the hit: its store-error policy and lease.
   */
  consume(hits: readonly RateLimitHit[], rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    if (this.leases && rules.some((rule) => rule.lease > 0)) return this.consumeLeased(hits, rules, now);
    return this.consumeAsking(hits, rules, now);
  }

  /**
   * Every hit asked of the store, unless the block cache knows the answer. Without a wait, one
   * promise beyond the store's: this is the path nearly every request takes.
   */
  private consumeAsking(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption> {
    // The block cache's time: the module's clock (as the store decides on it), else this process's.
    const sentAt = now ?? performance.now();
    const refused = this.blocked?.refusal(hits, sentAt);
    if (refused) {
      this.options.observer?.blockCacheHit();
      return Promise.resolve(refused);
    }
    const waiting = this.inFlight?.enter(hits);
    if (waiting) return this.consumeHeld(hits, rules, now, waiting);
    return this.askEntered(hits, rules, now, sentAt);
  }

  /** A call held by `KeysInFlight`: asks the block cache again after each answer it waited for. */
  private async consumeHeld(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
    waiting: Promise<unknown>,
  ): Promise<ResilientConsumption> {
    const { clock } = this.options;
    let at = now;
    for (;;) {
      const error = await waiting;
      // The call waited for failed: so does this one, which never reached the store.
      if (error !== undefined) {
        this.inFlight!.leave(hits);
        return this.decideWithout(hits, rules, error, at, true);
      }
      // Read again after a wait: a block must not be judged on a time from before it.
      at = clock ? Math.floor(clock()) : now;
      const sentAt = at ?? performance.now();
      const refused = this.blocked?.refusal(hits, sentAt);
      if (refused) {
        this.inFlight!.leave(hits);
        this.options.observer?.blockCacheHit();
        return refused;
      }
      const next = this.inFlight!.enter(hits);
      if (!next) return this.askEntered(hits, rules, at, sentAt);
      waiting = next;
    }
  }

  /** One store call for hits `KeysInFlight` let go (if it holds any); a failure decided by the policies. */
  private askEntered(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
    sentAt: number,
  ): Promise<ResilientConsumption> {
    const since = this.blocked?.since ?? 0;
    return this.call(hits, now).then(
      (consumption) => {
        this.learn(hits, consumption, now, sentAt, since);
        this.inFlight?.answered(hits, consumption);
        return consumption;
      },
      (error: unknown) => {
        this.inFlight?.answered(hits, undefined, error);
        return this.decideWithout(hits, rules, error, now);
      },
    );
  }

  /**
   * Hits of leased rules take their units from this instance's lease where it holds them; the rest,
   * and the grants of new leases, go to the store in one call. A request is admitted on every rule
   * or on none: units taken from a lease for a request another rule refuses go back to it.
   */
  private async consumeLeased(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    given: number | undefined,
  ): Promise<ResilientConsumption> {
    const leases = this.leases!;
    const { clock } = this.options;
    /** Per key, the most a grant may ask: what the store said was left after a bigger ask. */
    let caps: Map<string, number> | undefined;
    for (let attempt = 1; ; attempt += 1) {
      // Read again on every pass: a lease must not be used on a time from before a wait.
      const now = attempt > 1 && clock ? Math.floor(clock()) : given;
      const sentAt = now ?? performance.now();
      const refused = this.blocked?.refusal(hits, sentAt);
      if (refused) {
        this.options.observer?.blockCacheHit();
        return refused;
      }
      const leasing = attempt < LEASED_ATTEMPTS;
      const decisions: RateLimitDecision[] = [];
      const taken: { hit: RateLimitHit; lease: Lease }[] = [];
      const asked: RateLimitHit[] = [];
      const askedFor: { index: number; grant: number }[] = [];
      let wait: PendingGrant | undefined;
      let refusedHere = false;
      hits.forEach((hit, index) => {
        const size = leasing ? rules[index].lease : 0;
        if (size === 0) {
          asked.push(hit);
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
        if (error !== undefined) return this.decideWithout(hits, rules, error, now, true);
        continue;
      }
      if (asked.length === 0) return { allowed: true, decisions, receipts: hits.map(() => LEASED) };

      const grants = askedFor.map(({ index, grant }) => (grant > 0 ? leases.asking(hits[index].key) : undefined));
      let consumption: RateLimitConsumption;
      try {
        consumption = await this.ask(asked, now, sentAt);
      } catch (error) {
        giveBack();
        for (const grant of grants) grant?.answer(error);
        return this.decideWithout(hits, rules, error, now);
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

  /** One call to the store, what it answered learned (block cache, fallback); throws what it throws. */
  private async ask(hits: readonly RateLimitHit[], now: number | undefined, sentAt: number) {
    const since = this.blocked?.since ?? 0;
    const consumption = await this.call(hits, now);
    this.learn(hits, consumption, now, sentAt, since);
    return consumption;
  }

  private call(hits: readonly RateLimitHit[], now: number | undefined): Promise<RateLimitConsumption> {
    const { observer } = this.options;
    return observer ? this.timed(observer, hits, now) : this.store.consume(hits, now);
  }

  /** What the store answered, learned: its refusals (block cache), its counts (fallback). */
  private learn(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    now: number | undefined,
    sentAt: number,
    since: number,
  ): void {
    this.blocked?.learn(hits, consumption, sentAt, since);
    if (this.fallback) {
      this.fallback.remember(hits, consumption, now ?? Date.now());
      if (this.fallback.hasPending) void this.recordFallbackUnits(now);
    }
  }

  private async timed(
    observer: StoreObserver,
    hits: readonly RateLimitHit[],
    now: number | undefined,
  ): Promise<RateLimitConsumption> {
    const started = performance.now();
    try {
      const consumption = await this.store.consume(hits, now);
      observer.called((performance.now() - started) / 1000, undefined);
      return consumption;
    } catch (error) {
      observer.called((performance.now() - started) / 1000, error);
      throw error;
    }
  }

  /** Only `countOn` admissions are settled here, and the block cache keeps none of theirs. */
  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    return this.store.settle(settlements);
  }

  /** The store's own reading: an operator's question, answered by the store or not at all (no policy decides it). */
  inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]> {
    return this.store.inspect(hits, now);
  }

  async reset(keys: readonly string[]): Promise<void> {
    this.fallback?.forget(keys);
    this.blocked?.forget(keys);
    this.leases?.forget(keys);
    await this.store.reset(keys);
  }

  /**
   * Decides a request the store could not: `'deny'` if any rule denies; otherwise `'local'` rules
   * are decided together by this instance and `'allow'` rules admit.
   * @param unsent whether the request never reached the store (what the fallback admits is then
   *   recorded in it later); by default, what the store says of the error.
   */
  private async decideWithout(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    error: unknown,
    given: number | undefined,
    unsent = this.store.neverReached(error),
  ): Promise<ResilientConsumption> {
    const now = given ?? Date.now();
    const policies = rules.map((rule) => rule.onStoreError ?? this.options.policy);
    const reason = describeError(error);
    this.problems.report(
      reason,
      `Rate-limit store failed (${reason}); requests decided by the store-error policy '${[...new Set(policies)].join('/')}'`,
    );
    const denied = policies.includes('deny');
    const localIndices = denied ? [] : policies.flatMap((policy, i) => (policy === 'local' ? [i] : []));
    const local =
      localIndices.length > 0 && this.fallback
        ? await this.fallback.consume(
            localIndices.map((i) => hits[i]),
            now,
            unsent,
          )
        : undefined;
    const allowed = !denied && (local?.allowed ?? true);
    const decisions = hits.map((hit, i): RateLimitDecision => {
      const localAt = localIndices.indexOf(i);
      if (local && localAt >= 0) return local.decisions[localAt];
      const refused = policies[i] === 'deny' || (policies[i] === 'local' && !allowed);
      return refused
        ? { allowed: policies[i] !== 'deny' && allowed, limit: hit.limit, remaining: 0, resetMs: STORE_ERROR_RETRY_MS }
        : unaskedDecision(hit);
    });
    return { allowed, decisions, receipts: undefined, storeError: policyOf(policies) };
  }

  /**
   * The store answers again: records in it what the fallback admitted meanwhile (for windows not
   * over yet), so those requests count against the limit there too. Never throws.
   */
  private async recordFallbackUnits(now: number | undefined): Promise<void> {
    const hits = this.fallback!.takePending(now ?? Date.now());
    try {
      for (let i = 0; i < hits.length; i += 100) await this.store.record(hits.slice(i, i + 100), now);
    } catch (error) {
      const reason = describeError(error);
      this.problems.report(`record:${reason}`, `Recording requests the fallback admitted failed (${reason})`);
    }
  }
}

/** The policy that decided a request the store could not: 'deny' if any rule denies. */
function policyOf(policies: readonly RateLimitStoreErrorPolicy[]): RateLimitStoreErrorPolicy {
  if (policies.includes('deny')) return 'deny';
  return policies.includes('local') ? 'local' : 'allow';
}

import { LRUCache } from 'lru-cache';
import { type StoreProblemLog, describeError } from '../logging/store-problem-log.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitStanding,
  type RateLimitSettlement,
  type RateLimitStore,
  committedUnits,
  unaskedDecision,
} from '../store/rate-limit-store.js';
import { DecidingStore, type HitHandling, type ResilientConsumption, type StoreObserver } from './deciding-store.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

/** Retry-After for requests refused because the store failed under the policy `'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

export interface ResilienceOptions {
  /** The module's `storeErrors.policy`, for hits whose rule names none. */
  policy: RateLimitStoreErrorPolicy;
  localFallback: LocalFallbackOptions;
  /** Told of every store call (metrics); none: nothing is timed. */
  observer?: StoreObserver;
}

/**
 * The bottom layer of the store as the limiter uses it: the configured store, and what keeps
 * requests decided while it fails. A failed call (an error, a missed deadline, an open circuit) is
 * decided by each rule's store-error policy (its `onStoreError`, else the module's
 * `storeErrors.policy`): `'deny'` refuses, `'allow'` admits, and `'local'` rules are decided
 * together by the local fallback, from what the store last reported. Once the store answers again,
 * what the fallback admitted meanwhile is recorded in it.
 *
 * A store in this process (`shared: false`) has no fallback and nothing to record: should it fail,
 * `'local'` rules admit as `'allow'` ones do.
 */
export class ResilientStore extends DecidingStore {
  private readonly fallback: LocalFallback | undefined;

  constructor(
    private readonly store: RateLimitStore,
    private readonly problems: StoreProblemLog,
    private readonly options: ResilienceOptions,
  ) {
    super();
    if (store.shared) this.fallback = new LocalFallback(options.localFallback);
  }

  get description(): string {
    return this.store.description;
  }

  /** One store call; a failure decided by the policies. One promise beyond the store's. */
  consume(hits: readonly RateLimitHit[], rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    return this.call(hits, now).then(
      (consumption) => this.learn(hits, consumption, now),
      (error: unknown) => this.decideFailed(hits, rules, error, now),
    );
  }

  attempt(hits: readonly RateLimitHit[], _rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    return this.call(hits, now).then((consumption) => this.learn(hits, consumption, now));
  }

  private call(hits: readonly RateLimitHit[], now: number | undefined): Promise<RateLimitConsumption> {
    const { observer } = this.options;
    return observer ? this.timed(observer, hits, now) : this.store.consume(hits, now);
  }

  /** What the store answered, learned by the fallback; what it admitted meanwhile recorded. */
  private learn(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number | undefined) {
    if (this.fallback) {
      this.fallback.remember(hits, consumption, now ?? Date.now());
      if (this.fallback.hasPending) void this.recordFallbackUnits(now);
    }
    return consumption;
  }

  private async timed(observer: StoreObserver, hits: readonly RateLimitHit[], now?: number) {
    const started = performance.now();
    const called = (error: unknown) => observer.called((performance.now() - started) / 1000, error);
    try {
      const consumption = await this.store.consume(hits, now);
      called(undefined);
      return consumption;
    } catch (error) {
      called(error);
      throw error;
    }
  }

  /** Only `countOn` admissions are settled here, and no layer keeps any of theirs. */
  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    return this.store.settle(settlements);
  }

  inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]> {
    return this.store.inspect(hits, now);
  }

  async reset(keys: readonly string[]): Promise<void> {
    this.fallback?.forget(keys);
    await this.store.reset(keys);
  }

  /**
   * Decides a request the store could not: `'deny'` if any rule denies; otherwise `'local'` rules
   * are decided together by this instance and `'allow'` rules admit.
   * @param unsent whether the request never reached the store (what the fallback admits is then
   *   recorded in it later); by default, what the store says of the error.
   */
  async decideFailed(
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
    const localHits = localIndices.map((i) => hits[i]);
    const local =
      localHits.length > 0 && this.fallback ? await this.fallback.consume(localHits, now, unsent) : undefined;
    const allowed = !denied && (local?.allowed ?? true);
    const decisions = hits.map((hit, i): RateLimitDecision => {
      const localAt = localIndices.indexOf(i);
      if (local && localAt >= 0) return local.decisions[localAt];
      const refused = policies[i] === 'deny' || (policies[i] === 'local' && !allowed);
      return refused
        ? { allowed: policies[i] !== 'deny' && allowed, limit: hit.limit, remaining: 0, resetMs: STORE_ERROR_RETRY_MS }
        : unaskedDecision(hit);
    });
    return { allowed, decisions, receipts: undefined, storeError: policyOf(policies), failure: error };
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

export interface LocalFallbackOptions {
  /** The estimate of what other instances admitted is multiplied by this. Default 1.2. */
  safetyFactor: number;
  /** A key Redis never reported on gets `count / expectedInstances` per window here. Default 2. */
  expectedInstances: number;
  /** Keys remembered at most. */
  maxKeys: number;
}

/**
 * Units admitted here while the store was out, to record in it once it is back; `until` their
 * window is over (recording them after would only punish later requests).
 */
type PendingUnits = { hit: RateLimitHit; until: number };

/** Two reports of one window end agree within this much (they are computed from two clocks). */
const WINDOW_MATCH_MS = 50;

/**
 * What Redis last said about a key: units used, under which limit (a changed limit changes the
 * count, not a loss), when, and when its window resets (on this instance's clock, read after the
 * reply: a stalled event loop delays it by the stall).
 */
type LastSeen = { used: number; limit: number; seenAt: number; resetAt: number };

/**
 * Decides while Redis cannot (the store-error policy `'local'`). Each instance remembers, per active key,
 * what Redis last reported; during the outage it assumes the other instances go on admitting at
 * the full rate, and admits only while `(last count + elapsed share of the window × limit) ×
 * safetyFactor` plus what it admitted itself stays within the limit. A key Redis never reported on
 * (or whose window has ended) gets an explicit local share, `count / expectedInstances`: never
 * unlimited. What it admits without having reached Redis is recorded there once Redis answers
 * again (`takePending`), for the units whose window is not over by then.
 */
export class LocalFallback {
  private readonly lastSeen: LRUCache<string, LastSeen>;
  private readonly local: MemoryRateLimitStore;
  private readonly pending: LRUCache<string, PendingUnits>;

  constructor(private readonly options: LocalFallbackOptions) {
    this.lastSeen = new LRUCache({ max: options.maxKeys });
    this.local = new MemoryRateLimitStore(options.maxKeys);
    this.pending = new LRUCache({ max: options.maxKeys });
  }

  /** Whether units admitted here wait to be recorded in the store. */
  get hasPending(): boolean {
    return this.pending.size > 0;
  }

  /** The units admitted here whose window is not over, as hits to record; forgets them all. */
  takePending(now: number): RateLimitHit[] {
    const hits = [...this.pending.values()].filter((units) => units.until > now).map((units) => units.hit);
    this.pending.clear();
    return hits;
  }

  /** Notes what Redis reported for each hit of a request. */
  remember(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number): void {
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const resetAt = now + consumption.decisions[i].resetMs;
      const used = committedUnits(hit, consumption, i);
      const seen = this.lastSeen.get(hit.key);
      // A fixed window's count never falls: keep the highest figure seen in the same window. (A
      // window taken for another after a stall only makes the latest figure count. The lost-write
      // check, which must name windows exactly, keeps its own by their start on Redis's clock.)
      const same = seen && hit.algorithm === 'fixed-window' && Math.abs(resetAt - seen.resetAt) <= WINDOW_MATCH_MS;
      const latest = same && seen.limit === hit.limit ? Math.max(used, seen.used) : used;
      if (seen) {
        // In place: the entry is the key's, and `get` has made it the most recent.
        seen.used = latest;
        seen.limit = hit.limit;
        seen.seenAt = now;
        seen.resetAt = resetAt;
      } else {
        this.lastSeen.set(hit.key, { used: latest, limit: hit.limit, seenAt: now, resetAt });
      }
    }
  }

  /** Reset keys start afresh: what Redis last said of them no longer holds. */
  forget(keys: readonly string[]): void {
    for (const key of keys) {
      this.lastSeen.delete(key);
      this.pending.delete(key);
    }
    void this.local.reset(keys.map((key) => `local:${key}`));
  }

  /**
   * Decides a request locally, all rules or none, as the Redis store would.
   * @param unsent true when the failed call never reached Redis (circuit open, no connection): only
   *   then are the admitted units recorded later. A call that timed out may still run in Redis, and
   *   recording its units too would count the request twice.
   */
  consume(hits: readonly RateLimitHit[], now: number, unsent: boolean): Promise<RateLimitConsumption> {
    const local = hits.map((hit): RateLimitHit => {
      const seen = this.lastSeen.get(hit.key);
      let allowance: number;
      if (seen && seen.resetAt > now) {
        const elapsedShare = Math.max(0, now - seen.seenAt) / hit.windowMs;
        const others = (seen.used + elapsedShare * hit.limit) * this.options.safetyFactor;
        allowance = Math.max(0, Math.floor(hit.limit - others));
      } else {
        allowance = Math.ceil(hit.limit / this.options.expectedInstances);
      }
      // Counted locally in a fixed window of the rule's length, against what is allowed now.
      return {
        ...hit,
        key: `local:${hit.key}`,
        // Its admissions are never settled (they carry no receipts), so none may stay in flight: a
        // rejection here is final and starts its penalty, as in Redis after settled failures.
        conditional: false,
        algorithm: 'fixed-window',
        limit: allowance,
      };
    });
    return this.local.consume(local, now).then((consumption) => {
      if (consumption.allowed && unsent) {
        for (const hit of hits) {
          // Recorded only into the window these units belong to: the one Redis reported, if it
          // still runs, else one starting now.
          const seen = this.lastSeen.get(hit.key);
          const until = seen && seen.resetAt > now ? seen.resetAt : now + hit.windowMs;
          const units = this.pending.get(hit.key);
          if (units && units.until > now) {
            units.hit = { ...units.hit, cost: units.hit.cost + hit.cost };
            units.until = Math.min(units.until, until);
          } else {
            this.pending.set(hit.key, { hit, until });
          }
        }
      }
      return {
        ...consumption,
        // Report the rule's own limit, not the local allowance.
        decisions: consumption.decisions.map((decision, i) => ({ ...decision, limit: hits[i].limit })),
        receipts: undefined,
      };
    });
  }
}

import { LRUCache } from 'lru-cache';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitHit,
  type RateLimitRefund,
  type RateLimitStanding,
  type RateLimitSettlement,
  type RateLimitStore,
  holdsInFlight,
} from '../store/rate-limit-store.js';
import { DecidingStore, type HitHandling, type ResilientConsumption, type StoreObserver } from './deciding-store.js';
import { settleFallbackAdmissions, settleInFallback } from './fallback-receipt.js';
import type { LastSeen, LastSeenKeys } from './last-seen.js';
import { LocalFallback, type LocalFallbackOptions } from './local-fallback.js';
import { StoreOutage } from './store-outage.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

export interface ResilienceOptions {
  /** The module's `storeErrors.policy`, for hits whose rule names none. */
  policy: RateLimitStoreErrorPolicy;
  localFallback: LocalFallbackOptions;
  /** Told of every store call: the `DECISION_OBSERVER` of `rateLimitMetrics()`; unset by default (nothing timed). */
  observer?: StoreObserver;
}

/**
 * The bottom layer of the store as the limiter uses it: the configured store, and what keeps
 * requests decided while it fails. A failed call (an error, a missed deadline, an open circuit) is
 * decided by each rule's store-error policy (its `onStoreError`, else the module's
 * `storeErrors.policy`): `'deny'` refuses, `'allow'` admits, and `'local'` rules are decided
 * together by the local fallback, from what the store last reported (`StoreOutage`). Once the store
 * answers again, what the fallback admitted meanwhile is recorded in it.
 *
 * A store in this process (`shared: false`) has no fallback and nothing to record: should it fail,
 * `'local'` rules admit as `'allow'` ones do.
 */
export class ResilientStore extends DecidingStore {
  private readonly fallback: LocalFallback | undefined;
  private readonly outage: StoreOutage;

  constructor(
    private readonly store: RateLimitStore,
    problems: StoreProblemLog,
    private readonly options: ResilienceOptions,
  ) {
    super();
    if (store.shared) {
      const lastSeen = new ReportedWindows(options.localFallback.maxKeys);
      this.fallback = new LocalFallback(lastSeen, { shardOf: (key) => store.shardOf(key), ...options.localFallback });
    }
    this.outage = new StoreOutage(store, problems, options.policy, this.fallback);
  }

  get description(): string {
    return this.store.description;
  }

  /** One store call; a failure decided by the policies. One promise beyond the store's. */
  consume(hits: readonly RateLimitHit[], rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    const sentAt = now ?? Date.now();
    return this.call(hits, now).then(
      (consumption) => this.learn(hits, consumption, now),
      (error: unknown) => this.outage.decide(hits, rules, error, now, this.store.neverReached(error), sentAt),
    );
  }

  attempt(hits: readonly RateLimitHit[], _rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    return this.call(hits, now).then((consumption) => this.learn(hits, consumption, now));
  }

  private call(hits: readonly RateLimitHit[], now: number | undefined): Promise<RateLimitConsumption> {
    const { observer } = this.options;
    return observer ? this.timed(observer, hits, now) : this.store.consume(hits, now);
  }

  /**
   * What the store answered, learned for the fallback; what the fallback admitted meanwhile for keys
   * of the shards that answered, recorded. The fallback itself is asked only when a field it keeps
   * says it has something to add: a healthy store's answer is only learned. No fallback code runs
   * for it: `lastSeen` is the `ReportedWindows` below, and `banked`, `heldUntil` and
   * `pending.perShard` (a Map) are plain fields, empty or 0 unless the store failed lately.
   */
  private learn(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    now: number | undefined,
  ): RateLimitConsumption {
    const { fallback } = this;
    if (fallback) {
      const at = now ?? Date.now();
      fallback.lastSeen.remember(hits, consumption, at);
      // Refused for want of units Redis counted late for requests refused here: those units.
      if (!consumption.allowed && fallback.lastSeen.banked.size > 0 && !hits.some(holdsInFlight)) {
        const banked = fallback.takeBanked(hits, at);
        if (banked) return banked;
      }
      // Admitted while a share the fallback took of a window still holds: within that share only.
      const refusals = consumption.allowed && at < fallback.heldUntil ? fallback.shareRefusals(hits, at) : undefined;
      if (refusals) return this.outage.refuseOverShare(hits, consumption, refusals, at);
      if (fallback.pending.perShard.size > 0) this.outage.recordPending(hits, now);
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

  /**
   * Only admissions in flight (`countOn`, `settleCost`) are settled here, and no layer keeps any of
   * theirs. Those the fallback decided are settled in it (`settleInFallback`).
   */
  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    const stored = this.settledLocally(settlements, (each) => (each.refund ? -each.hit.cost : 0));
    return stored.length > 0 ? this.store.settle(stored) : Promise.resolve();
  }

  charge(charges: readonly RateLimitRefund[], now: number | undefined): Promise<void> {
    const stored = this.settledLocally(charges, (each) => each.hit.cost, now);
    if (stored.length === 0) return Promise.resolve();
    return this.store.record(
      stored.map(({ hit, receipt }) => ({ ...hit, settles: receipt.nonce })),
      now,
    );
  }

  /** Settles in the fallback what it admitted; returns the rest, for the store. */
  private settledLocally<T extends RateLimitRefund>(
    settlements: readonly T[],
    units: (settlement: T) => number,
    now?: number,
  ): readonly T[] {
    const { fallback } = this;
    if (!fallback) return settlements;
    const at = now ?? Date.now();
    return settleFallbackAdmissions(settlements, units, (hit, n, receipt) =>
      settleInFallback(fallback, hit, n, receipt, at),
    );
  }

  inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]> {
    return this.store.inspect(hits, now);
  }

  async reset(keys: readonly string[]): Promise<void> {
    this.forget(keys);
    await this.store.reset(keys);
  }

  /** Keys reset or refunded here or on another instance: what Redis said of them no longer holds. */
  forget(keys: readonly string[]): void {
    this.fallback?.forget(keys);
  }

  /**
   * Decides a request the store could not (`StoreOutage.decide`).
   * @param unsent whether the request never reached the store (what the fallback admits is then
   *   recorded in it later); by default, what the store says of the error.
   */
  decideFailed(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    error: unknown,
    given: number | undefined,
    unsent = this.store.neverReached(error),
  ): Promise<ResilientConsumption> {
    return this.outage.decide(hits, rules, error, given, unsent, undefined);
  }
}

/** Two reports of one window end agree within this much (they are computed from two clocks). */
const WINDOW_MATCH_MS = 50;

/** A key's rate is trusted once heard over this long: two replies a ms apart say nothing of it. */
const RATE_SPAN_MS = 100;

/**
 * What Redis last said of each active key (`LastSeenKeys`), heard from every answer of the store,
 * on time or late, for the local fallback to decide from should the store fail.
 */
export class ReportedWindows implements LastSeenKeys {
  private readonly windows: LRUCache<string, LastSeen>;
  readonly banked = new Set<string>();

  constructor(maxKeys: number) {
    // Bounded by a count of entries (`maxSize`, each of size 1) rather than `max`, which reserves
    // room for all of them at start: the memory follows the keys in use.
    this.windows = new LRUCache({
      maxSize: maxKeys,
      sizeCalculation: () => 1,
      dispose: (_, key) => this.banked.delete(key),
    });
  }

  get(key: string): LastSeen | undefined {
    return this.windows.get(key);
  }

  set(key: string, seen: LastSeen): void {
    this.windows.set(key, seen);
  }

  delete(key: string): void {
    this.windows.delete(key);
  }

  /**
   * How far apart two reports of one window's end may be. Each is read as the reply's `resetMs` from
   * when the app read it, so a busy event loop moves it later: the late answers Redis sends together
   * at a stall's end, read over 60 ms of a loaded loop, named one window by ends 60 ms apart, and the
   * units banked from the first were dropped as another window's. A fixed window's next one ends a
   * whole window after it at the soonest (a reset lets it start sooner, and is announced: `forget`),
   * so half a window tells them apart; the other algorithms' reset moves with every decision.
   */
  matchMs(hit: RateLimitHit): number {
    return hit.algorithm === 'fixed-window' ? Math.max(WINDOW_MATCH_MS, hit.windowMs / 2) : WINDOW_MATCH_MS;
  }

  /** Notes what Redis reported for each hit of a request, on time or late. */
  remember(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number): void {
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const resetAt = now + consumption.decisions[i].resetMs;
      const used = committedUnits(hit, consumption, i);
      const seen = this.windows.get(hit.key);
      if (!seen) {
        this.windows.set(hit.key, {
          used,
          limit: hit.limit,
          resetAt,
          admitted: 0,
          guessed: false,
          blockedUntil: 0,
          banked: 0,
          at: now,
          since: now,
          sinceUsed: used,
          rate: 0,
        });
        continue;
      }
      // In place: the entry is the key's, and `get` has made it the most recent.
      // A late answer of a window gone, or of one before the window known here: nothing to learn.
      // A window guessed here is replaced by Redis's own at its first report (below).
      const match = seen.guessed ? WINDOW_MATCH_MS : this.matchMs(hit);
      if (resetAt <= now || (resetAt < seen.resetAt - match && !seen.guessed)) continue;
      if (Math.abs(resetAt - seen.resetAt) <= match) {
        // The same window: a fixed window's count never falls (late answers come out of order).
        const same = hit.algorithm === 'fixed-window' && seen.limit === hit.limit;
        seen.used = same ? Math.max(used, seen.used) : used;
        seen.limit = hit.limit;
        // Redis's report of a window guessed here names it from now on: the guess was only the
        // time of a local decision, and later reports, read late on a busy loop, drift from it.
        if (seen.guessed) {
          seen.resetAt = resetAt;
          seen.guessed = false;
        }
        if (now - seen.since >= RATE_SPAN_MS)
          seen.rate = Math.max(0, (seen.used - seen.sinceUsed) / (now - seen.since));
        seen.at = Math.max(seen.at, now);
        continue;
      }
      // Another window. What this instance admitted in a window it guessed stays counted when the
      // two overlap: Redis's may have started later (on a stalled Redis, when it ran the late calls),
      // and the requests admitted meanwhile are of the same moment to their clients.
      const carried = seen.guessed && seen.resetAt > resetAt - hit.windowMs;
      seen.admitted = carried ? seen.admitted : 0;
      if (!carried) seen.held = seen.others = undefined;
      seen.used = used;
      seen.limit = hit.limit;
      seen.resetAt = resetAt;
      seen.guessed = false;
      seen.banked = 0;
      this.banked.delete(hit.key);
      // The rate carries over: the traffic is the same.
      seen.at = seen.since = now;
      seen.sinceUsed = used;
    }
  }
}

/** Units in a hit's counter after its request: nothing of a refused request was counted. */
function committedUnits(hit: RateLimitHit, consumption: RateLimitConsumption, index: number): number {
  const { allowed, remaining } = consumption.decisions[index];
  // A rule that would have admitted a request another rule refused counted none of it.
  return hit.limit - (!consumption.allowed && allowed ? remaining + hit.cost : remaining);
}

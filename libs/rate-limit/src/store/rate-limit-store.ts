import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';

/** Keys outlive the time their state matters by this much, so a slow call never finds them gone. */
export const GRACE_MS = 1_000;

/**
 * The longest a `settleCost` admission's claim (`overdraftBound`) is held unsettled, however long
 * its window: a request whose settlement never came (a crash, a lost call) must not hold a day's
 * budget for a day. A request running longer loses its claim, and with it the bound, only then.
 */
export const CLAIM_MS = 10 * 60_000;

/** How long a claim of this hit lives unsettled: `CLAIM_MS`, or its window if shorter. */
export function claimMs(hit: Pick<RateLimitHit, 'windowMs'>): number {
  return Math.min(hit.windowMs, CLAIM_MS);
}

/** One rule's claim on its counter for one request. */
export interface RateLimitHit {
  /**
   * The state key (`rateLimitKey`: prefix, identity as hash tag, rule, algorithm). A store keeps
   * any other key of the hit beside it (`keysBeside`), in the same hash slot.
   */
  key: string;
  algorithm: RateLimitAlgorithmName;
  /** Units admitted per window. */
  limit: number;
  windowMs: number;
  /** Units this request consumes. */
  cost: number;
  /** Capacity of token-bucket and gcra. */
  burst: number;
  /** After a rejection by this rule, reject the identity for this long (0: no penalty). */
  blockMs: number;
  /**
   * A `countOn` rule: an admission stays in flight until the response settles (`settle`), and a
   * rejection caused only by units in flight is provisional: no penalty, and worth asking again.
   */
  conditional: boolean;
  /**
   * A `concurrency` cap's: its admission is a slot, held while the request runs (renewed by
   * `renewSlots`) and given back when it ends, so a refusal lasts only until some request ends:
   * never kept by the block cache nor checked for lost writes. A store of your own may ignore it.
   */
  slot?: boolean;
  /**
   * Requests wait for room under this hit's rule (`wait`): a shared store tells every instance when
   * its count falls by a refund, a slot given back included (`watchLiftedKeys`), so that their
   * waiters ask again. A store of your own may ignore it: waiters then ask again on their own.
   */
  waitedOn?: boolean;
  /**
   * A `settleCost` rule's admission: the most it may yet be charged past its cost
   * (`settleCost.max` less `cost`). Until settled (a window at most) it counts against the identity's other admissions, so
   * requests in flight together cannot overdraw the budget by more than one of them. Undefined for
   * other rules. A store of your own may ignore it (and with it the bound).
   */
  overdraftBound?: number;
  /**
   * A charge (`record`) that settles an admission of a `settleCost` rule: the admission's nonce,
   * whose claim in flight (`overdraftBound`) it ends in the same call.
   */
  settles?: string;
  /**
   * Units counted after the fact (`record`) that were admitted in a window of their own (the local
   * fallback's, while the store was out): when that window ends, on the clock of the calls (the
   * `now` given, else this process's). A fixed window counts them only in that window: one the store
   * no longer holds starts again ending then, and one it started since (a store restarted empty, a
   * window that ended while the units waited) holds none of them. A store of your own may ignore it.
   */
  windowEndsAt?: number;
}

/**
 * Whether an admission of this hit stays in flight until settled (`countOn` units, a `settleCost`
 * claim): whoever admits it without the request's settlement to follow must end it.
 */
export function holdsInFlight(hit: RateLimitHit): boolean {
  return hit.conditional || hit.slot === true || (hit.overdraftBound ?? 0) > 0;
}

/** Whether ending an admission of this hit that its request never settles takes its units back. */
export function givenBack(hit: RateLimitHit): boolean {
  return hit.conditional || hit.slot === true;
}

/** The same shape from every store and algorithm, so headers and `Retry-After` never differ. */
export interface RateLimitDecision {
  allowed: boolean;
  limit: number;
  /** Units still available after this request. */
  remaining: number;
  /** Admitted: ms until the full limit is available again. Rejected: ms until it would be admitted. */
  resetMs: number;
  /**
   * Rejected by a `conditional` rule only because of units still in flight, which may yet be
   * refunded: no penalty started, and the same request may be admitted once they settle.
   */
  provisional?: boolean;
}

/** What a store needs to take an admitted hit back. Opaque to callers. */
export interface RateLimitReceipt {
  /** The time the hit was admitted at, on the clock that decided it. */
  readonly admittedAt: number;
  readonly nonce: string;
  /**
   * Redis, a fixed window timed by its key's TTL: the start of the admission's window (Redis's
   * time), which names the window its units may be refunded into.
   */
  readonly windowStart?: number;
}

/** The decisions for all rules of one request. */
export interface RateLimitConsumption {
  /** True when every rule admitted, and so every counter moved; false when none moved. */
  allowed: boolean;
  /** One per hit, in order. */
  decisions: RateLimitDecision[];
  /** One per hit when `allowed`: what `refund` needs. */
  receipts: RateLimitReceipt[] | undefined;
}

/**
 * Units a rule leaves after its request. A rule that would admit a request another rule refused
 * reports its count as if the request were admitted; nothing of it was counted.
 */
export function remainingAfter(decision: RateLimitDecision, requestAllowed: boolean, cost: number): number {
  return !requestAllowed && decision.allowed ? decision.remaining + cost : decision.remaining;
}

/**
 * The decision of a rule that was not asked, because another rule decided its request without the
 * store (a block, a lease, the `'allow'` policy): it reads as admitting, with its full limit.
 */
export function unaskedDecision(hit: RateLimitHit): RateLimitDecision {
  return { allowed: true, limit: hit.limit, remaining: hit.limit, resetMs: hit.windowMs };
}

/** A rule's counter for one identity as it stands, read without counting anything (`inspect`). */
export interface RateLimitStanding {
  /** Units a request could take now (for token-bucket and gcra, of the burst). */
  remaining: number;
  /** Ms until the full limit is available again (0: nothing counted). */
  resetMs: number;
  /** Ms a `blockFor` penalty has left (0: none). */
  blockedMs: number;
}

/** Units a full counter holds: the burst of token-bucket and gcra, the limit of the others. */
export function capacityOf(hit: RateLimitHit): number {
  return hit.algorithm === 'token-bucket' || hit.algorithm === 'gcra' ? hit.burst : hit.limit;
}

/** An admitted hit to take back. */
export interface RateLimitRefund {
  hit: RateLimitHit;
  receipt: RateLimitReceipt;
}

/** An admitted hit whose request has ended: its units taken back (`refund: true`) or kept. */
export interface RateLimitSettlement extends RateLimitRefund {
  refund: boolean;
}

/** What a shared store tells an instance of counts lowered anywhere (`watchLiftedKeys`). */
export interface LiftedKeysWatcher {
  /** These state keys were reset or refunded: a store may admit them again. */
  lifted(keys: readonly string[]): void;
  /** Whether news reaches this instance from now on (false: some may be missed until it is true again). */
  listening(on: boolean): void;
}

/**
 * Where counters live. A store decides all hits of one request atomically: either every rule
 * admits and every counter moves, or the request is rejected and no counter moves.
 */
export abstract class RateLimitStore {
  /** For the startup log: what this store is and whether instances share it. */
  abstract readonly description: string;
  /**
   * Whether the counters live outside this process, shared by every instance (Redis). Such a store
   * can fail while the app runs; the module then decides with the store-error policies and, for
   * `'local'`, a fallback in this instance (`resilience/`). A store in this process (false) gets no
   * fallback.
   */
  readonly shared: boolean = true;
  /**
   * @param now the time in ms from the module's `clock` option; without it the store's own clock
   *   (Redis `TIME`, so app servers with skewed clocks agree).
   */
  abstract consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption>;
  /**
   * Ends admitted hits: no longer in flight, and those with `refund` taken back as far as their
   * windows still hold them (a window that has ended stays ended).
   */
  abstract settle(settlements: readonly RateLimitSettlement[]): Promise<void>;
  /** Takes back the units of admitted hits: `settle` with `refund` for each. */
  refund(refunds: readonly RateLimitRefund[]): Promise<void> {
    return this.settle(refunds.map((refund) => ({ ...refund, refund: true })));
  }
  /**
   * Counts units that were admitted without the store (by the fallback while it was out), without
   * deciding anything: counters may pass their limit.
   */
  abstract record(hits: readonly RateLimitHit[], now?: number): Promise<void>;
  /**
   * Forgets every count, penalty and admission in flight of the given state keys (and the keys
   * beside them): their identities start afresh.
   */
  abstract reset(keys: readonly string[]): Promise<void>;
  /**
   * Reads each hit's counter as a request costing nothing would find it, counting nothing: for
   * operators (`RateLimitManagementService.inspect`). The default rejects: a store of your own
   * need not support it.
   */
  inspect(_hits: readonly RateLimitHit[], _now?: number): Promise<RateLimitStanding[]> {
    return Promise.reject(new Error(`The ${this.description} cannot inspect counters`));
  }
  /**
   * Keeps the slots of `concurrency` caps (admissions of `slot` hits) taken while their requests
   * run: each is dated `now` (the store's clock without it), as if admitted again, without counting
   * anything. Resolves with each slot's new time, which its receipt then carries; undefined for one
   * the store no longer holds (its lease ran out, or it was reset). The default renews nothing: a
   * store of your own that does not gives a slot back after `SLOT_LEASE_MS` however long its
   * request runs.
   */
  renewSlots(slots: readonly RateLimitRefund[], _now?: number): Promise<(number | undefined)[]> {
    return Promise.resolve(slots.map(() => undefined));
  }
  /**
   * Whether a failed call certainly never reached the store (no connection, an open circuit). Only
   * then are the requests a fallback admitted in its stead recorded in it later: a call that may
   * have run is never recorded again, so a request counts once. Default false: never recorded.
   */
  neverReached(_error: unknown): boolean {
    return false;
  }
  /**
   * What a call that failed with `error` decided after all, when the store may still answer it: a
   * call past its deadline that went out runs late on a store that is slow, not down, and its answer
   * tells the fallback the counts it is deciding on. `now` as given to that `consume`. Default
   * undefined: no late answer.
   */
  lateAnswer(
    _hits: readonly RateLimitHit[],
    _error: unknown,
    _now?: number,
  ): Promise<RateLimitConsumption> | undefined {
    return undefined;
  }
  /**
   * The part of the store a key lives on: keys of one shard answer or fail together (on Redis
   * Cluster, a hash slot). What a fallback admitted for a key is recorded once a call on its shard
   * answers, never sent to one that may still be down. Default: one shard for every key.
   */
  shardOf(_key: string): string {
    return '';
  }
  /**
   * A shared store: tells `watcher` of the state keys whose counts any instance lowered other than by
   * time (a reset, a refund), and whether such news reaches this instance now. Returns whether it
   * can; only then does the module keep refused keys in this instance (`blockCache`). Default false.
   */
  watchLiftedKeys(_watcher: LiftedKeysWatcher): boolean {
    return false;
  }
}

import { LRUCache } from 'lru-cache';
import type { RateLimitDecision, RateLimitHit } from '../store/rate-limit-store.js';

/** Units of one key's window that a shared store granted this instance, not yet admitted. */
export interface Lease {
  units: number;
  /** When the window ends, on the clock of the calls; taken from before the grant was asked. */
  until: number;
  /** The rule's limit and window then: other thresholds are another question for the store. */
  limit: number;
  windowMs: number;
  /** What the store had left after the grant (after its refusal: what it had left). */
  storeRemaining: number;
  /** The store refused a request of this cost or more: refused here too until `until`. */
  refusedCost: number;
}

/** A grant being asked of the store: requests for its key wait for it (`take` says `wait`). */
export interface PendingGrant {
  readonly key: string;
  /** Resolves with the store's error when the call failed, else undefined. */
  readonly answered: Promise<unknown>;
  /** The key was reset meanwhile: what the store answers may predate the reset. */
  reset: boolean;
  /** News of resets may have been missed meanwhile: a refusal is not kept. */
  deafened: boolean;
  answer(error?: unknown): void;
}

/** What `take` says: the decision, or that the store must be asked, or which grant to wait for. */
export type LeaseTake =
  { decided: RateLimitDecision; lease: Lease | undefined } | { ask: number } | { wait: PendingGrant };

/**
 * Units of hot counters (rules with `lease`) taken from a shared store in batches, so one instance
 * asks the store once per `lease` requests instead of once per request.
 *
 * Exact on the side that matters: every unit admitted here was counted in the store before, in the
 * window it is admitted in. A lease ends no later than the store's window (its time is taken from
 * before the grant was asked), and units are never carried into another window, so across instances
 * no window admits more than its limit. The price is units granted but never admitted: what an
 * instance holds when its requests stop or the window ends, at most `lease` (plus the largest cost
 * less one, when costs vary: what a new grant replaces), and the units of a grant whose answer was
 * lost (a call that timed out after it ran).
 *
 * One grant per key is asked at a time; requests arriving meanwhile wait for it (`wait`). A store's
 * refusal is kept until its reset, like the block cache, only while news of lowered counts reaches
 * this instance (`listening`). Any such news (a reset, a refund) drops the key's lease: the units a
 * reset took from the store must not be admitted here. The module uses leases only with a store
 * that sends such news; a reset made while this instance cannot hear of it (its subscription down)
 * may let its held units, a lease at most, pass the limit once.
 */
export class LeasedUnits {
  private readonly leases: LRUCache<string, Lease>;
  private readonly granting = new Map<string, PendingGrant>();
  private keepRefusals = false;
  /** Whether news has reached this instance before: a later `listening(true)` may follow a gap. */
  private heard = false;

  constructor(maxKeys: number) {
    this.leases = new LRUCache({ max: maxKeys });
  }

  /**
   * Takes a hit's units from its lease at `now`; else says how many units to ask the store for (at
   * least the hit's cost, at most its limit), or which grant to wait for first.
   */
  take(hit: RateLimitHit, leaseSize: number, now: number): LeaseTake {
    const lease = this.leases.get(hit.key);
    if (lease && lease.until > now && lease.limit === hit.limit && lease.windowMs === hit.windowMs) {
      const resetMs = Math.max(1, Math.ceil(lease.until - now));
      if (lease.units >= hit.cost) {
        lease.units -= hit.cost;
        const remaining = lease.storeRemaining + lease.units;
        return { decided: { allowed: true, limit: hit.limit, remaining, resetMs }, lease };
      }
      if (hit.cost >= lease.refusedCost) {
        const remaining = lease.storeRemaining + lease.units;
        return { decided: { allowed: false, limit: hit.limit, remaining, resetMs }, lease: undefined };
      }
    }
    // A free request asks for nothing: a grant for it would only be held.
    if (hit.cost === 0) return { ask: 0 };
    const granting = this.granting.get(hit.key);
    if (granting) return { wait: granting };
    return { ask: Math.min(hit.limit, Math.max(leaseSize, hit.cost)) };
  }

  /** A grant for the key is asked now: `take` tells others to wait until its `answer`. */
  asking(key: string): PendingGrant {
    let resolve!: (error: unknown) => void;
    const answered = new Promise<unknown>((done) => (resolve = done));
    const grant: PendingGrant = {
      key,
      answered,
      reset: false,
      deafened: false,
      answer: (error) => {
        if (this.granting.get(key) === grant) this.granting.delete(key);
        resolve(error);
      },
    };
    this.granting.set(key, grant);
    return grant;
  }

  /** Units taken by a request another rule refused: back to the lease, if it still holds. */
  giveBack(hit: RateLimitHit, lease: Lease): void {
    if (this.leases.peek(hit.key) === lease) lease.units += hit.cost;
  }

  /**
   * The store's answer to `grant`, of `asked` units for `hit`, asked at `sentAt`: keeps what the
   * request does not use. Returns the request's decision as this instance sees it (the units it
   * holds count as remaining).
   */
  granted(
    hit: RateLimitHit,
    grant: PendingGrant,
    asked: number,
    decision: RateLimitDecision,
    requestAllowed: boolean,
    sentAt: number,
  ): RateLimitDecision {
    if (grant.reset) return decision;
    const until = sentAt + decision.resetMs;
    if (requestAllowed) {
      // The units of an earlier grant may be of an earlier window: never carried into this one.
      const units = asked - hit.cost;
      this.leases.set(hit.key, this.lease(hit, units, until, decision.remaining, Number.POSITIVE_INFINITY));
      return { ...decision, remaining: decision.remaining + units };
    }
    if (!decision.allowed && decision.remaining < hit.cost && this.keepRefusals && !grant.deafened) {
      this.leases.set(hit.key, this.lease(hit, 0, until, decision.remaining, hit.cost));
    }
    return decision;
  }

  /** Counts of these keys were lowered (a reset, a refund): their leases go, and grants in flight are not kept. */
  forget(keys: readonly string[]): void {
    for (const key of keys) {
      this.leases.delete(key);
      const grant = this.granting.get(key);
      if (grant) grant.reset = true;
    }
  }

  /**
   * Whether news of lowered counts reaches this instance: refusals are kept only while it does.
   * Held units are this instance's unless the store's count was reset while the news could not
   * arrive, and they keep requests admitted exactly while the store is away; so they are dropped
   * only when news comes back after a gap (or unreadable news arrived), not when it first starts.
   */
  listening(on: boolean): void {
    for (const grant of this.granting.values()) grant.deafened = true;
    this.keepRefusals = on;
    if (on) {
      if (this.heard) this.leases.clear();
      this.heard = true;
      return;
    }
    const refusals = [...this.leases.entries()].filter(([, lease]) => lease.refusedCost < Number.POSITIVE_INFINITY);
    for (const [key] of refusals) this.leases.delete(key);
  }

  private lease(hit: RateLimitHit, units: number, until: number, storeRemaining: number, refusedCost: number): Lease {
    return { units, until, limit: hit.limit, windowMs: hit.windowMs, storeRemaining, refusedCost };
  }
}

import { LRUCache } from 'lru-cache';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import { type RateLimitConsumption, type RateLimitHit, committedUnits } from '../store/rate-limit-store.js';

export interface LocalFallbackOptions {
  /** The estimate of what other instances admitted is multiplied by this. Default 1.2. */
  safetyFactor: number;
  /** A key Redis never reported on gets `count / expectedInstances` per window here. Default 2. */
  expectedInstances: number;
  /** Keys remembered at most. */
  maxKeys: number;
}

/** Units admitted here while the store was out, to record in it once it is back. */
interface PendingUnits {
  hit: RateLimitHit;
  /** After this, the units' window is over and recording them would only punish later requests. */
  until: number;
}

/** Two reports of one window end agree within this much (they are computed from two clocks). */
const WINDOW_MATCH_MS = 50;

/** What Redis last said about a key. */
interface LastSeen {
  used: number;
  /** The rule's limit then: a changed limit changes the reported count, not a loss. */
  limit: number;
  seenAt: number;
  /** On this instance's clock, read after the reply: a stalled event loop delays it by the stall. */
  resetAt: number;
}

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

import { LRUCache } from 'lru-cache';
import { MemoryRateLimitStore } from './memory-rate-limit.store.js';
import type { RateLimitConsumption, RateLimitHit } from './rate-limit-store.js';

export interface LocalFallbackOptions {
  /** The estimate of what other instances admitted is multiplied by this. Default 1.2. */
  safetyFactor: number;
  /** A key Redis never reported on gets `count / expectedInstances` per window here. Default 2. */
  expectedInstances: number;
  /** Keys remembered at most. */
  maxKeys: number;
}

/** What Redis last said about a key. */
interface LastSeen {
  used: number;
  seenAt: number;
  resetAt: number;
}

/**
 * Decides while Redis cannot (`onStoreError: 'local'`). Each instance remembers, per active key,
 * what Redis last reported; during the outage it assumes the other instances go on admitting at
 * the full rate, and admits only while `(last count + elapsed share of the window × limit) ×
 * safetyFactor` plus what it admitted itself stays within the limit. A key Redis never reported on
 * (or whose window has ended) gets an explicit local share, `count / expectedInstances`: never
 * unlimited. What it admits is not written back to Redis (see the README).
 */
export class LocalFallback {
  private readonly lastSeen: LRUCache<string, LastSeen>;
  private readonly local: MemoryRateLimitStore;

  constructor(private readonly options: LocalFallbackOptions) {
    this.lastSeen = new LRUCache({ max: options.maxKeys });
    this.local = new MemoryRateLimitStore(options.maxKeys);
  }

  /** Notes what Redis reported for each hit of a request. */
  remember(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number): void {
    hits.forEach((hit, i) => {
      const { remaining, resetMs } = consumption.decisions[i];
      this.lastSeen.set(hit.key, { used: hit.limit - remaining, seenAt: now, resetAt: now + resetMs });
    });
  }

  /** Decides a request locally, all rules or none, as the Redis store would. */
  consume(hits: readonly RateLimitHit[], now: number): Promise<RateLimitConsumption> {
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
        blockKey: `local:${hit.blockKey}`,
        algorithm: 'fixed-window',
        limit: allowance,
      };
    });
    return this.local.consume(local, now).then((consumption) => ({
      ...consumption,
      // Report the rule's own limit, not the local allowance.
      decisions: consumption.decisions.map((decision, i) => ({ ...decision, limit: hits[i].limit })),
      receipts: undefined,
    }));
  }
}

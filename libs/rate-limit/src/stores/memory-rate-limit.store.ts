import { LRUCache } from 'lru-cache';
import { type FixedWindowState, fixedWindowHit } from '../algorithms/fixed-window.js';
import { RateLimitStore, type RateLimitDecision, type RateLimitHit } from './rate-limit-store.js';

/**
 * Counters in this process: for the demo, tests and single-instance apps. The number of keys is
 * bounded; the least recently used key is evicted first (its identity starts a fresh window).
 * Not shared across instances: N instances admit up to N times the limit.
 */
export class MemoryRateLimitStore extends RateLimitStore {
  readonly description: string;
  private readonly windows: LRUCache<string, FixedWindowState>;

  constructor(maxKeys: number) {
    super();
    this.windows = new LRUCache({ max: maxKeys });
    this.description = `in-process memory store (up to ${maxKeys} keys; not shared across instances)`;
  }

  hit(hit: RateLimitHit): Promise<RateLimitDecision> {
    const { state, decision } = fixedWindowHit(this.windows.get(hit.key), hit, Date.now());
    this.windows.set(hit.key, state);
    return Promise.resolve(decision);
  }

  /** Number of keys held; for tests and diagnostics. */
  get size(): number {
    return this.windows.size;
  }
}

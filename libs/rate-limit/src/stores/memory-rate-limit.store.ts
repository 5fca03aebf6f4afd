import { LRUCache } from 'lru-cache';
import type { AlgorithmStep } from '../algorithms/algorithm.js';
import { ALGORITHMS } from '../algorithms/algorithms.js';
import { GRACE_MS } from '../redis/consume.script.js';
import {
  RateLimitStore,
  type RateLimitConsumption,
  type RateLimitHit,
  type RateLimitRefund,
} from './rate-limit-store.js';

type Step = Pick<AlgorithmStep<unknown>, 'allowed' | 'remaining' | 'resetMs'> & {
  next?: unknown;
  ttlMs?: number;
  blocked?: boolean;
};

/**
 * Counters in this process: for the demo, tests and single-instance apps. The same algorithms
 * and all-or-nothing semantics as the Redis store. The number of keys is bounded; the least
 * recently used key is evicted first (its identity starts afresh).
 * Not shared across instances: N instances admit up to N times the limit.
 */
export class MemoryRateLimitStore extends RateLimitStore {
  readonly description: string;
  private readonly states: LRUCache<string, { value: unknown }>;
  private readonly blockedUntil: LRUCache<string, number>;

  constructor(maxKeys: number) {
    super();
    this.states = new LRUCache({ max: maxKeys });
    this.blockedUntil = new LRUCache({ max: maxKeys });
    this.description = `in-process memory store (up to ${maxKeys} keys; not shared across instances)`;
  }

  consume(hits: readonly RateLimitHit[], clock?: number): Promise<RateLimitConsumption> {
    // Whole milliseconds, as the Redis scripts use.
    const now = Math.floor(clock ?? Date.now());
    const steps: Step[] = hits.map((hit) => {
      const until = hit.blockMs > 0 ? this.blockedUntil.get(hit.blockKey) : undefined;
      if (until !== undefined && until > now) {
        return { allowed: false, remaining: 0, resetMs: until - now, blocked: true };
      }
      return ALGORITHMS[hit.algorithm].step(this.states.get(hit.key)?.value, hit, now);
    });
    const allowed = steps.every((step) => step.allowed);
    hits.forEach((hit, i) => {
      const step = steps[i];
      if (allowed) {
        // Kept as long as the state matters (plus the same grace as in Redis), then freed.
        this.states.set(hit.key, { value: step.next }, { ttl: (step.ttlMs ?? 0) + GRACE_MS });
      } else if (!step.allowed && !step.blocked && hit.blockMs > 0) {
        this.blockedUntil.set(hit.blockKey, now + hit.blockMs, { ttl: hit.blockMs + GRACE_MS });
        step.resetMs = Math.max(step.resetMs, hit.blockMs);
      }
    });
    return Promise.resolve({
      allowed,
      decisions: hits.map((hit, i) => ({
        allowed: steps[i].allowed,
        limit: hit.limit,
        remaining: steps[i].remaining,
        resetMs: steps[i].resetMs,
      })),
      receipts: allowed ? hits.map(() => ({ admittedAt: now, nonce: '' })) : undefined,
    });
  }

  record(hits: readonly RateLimitHit[], clock?: number): Promise<void> {
    const now = Math.floor(clock ?? Date.now());
    for (const hit of hits) {
      const step = ALGORITHMS[hit.algorithm].step(this.states.get(hit.key)?.value, hit, now);
      this.states.set(hit.key, { value: step.next }, { ttl: step.ttlMs + GRACE_MS });
    }
    return Promise.resolve();
  }

  refund(refunds: readonly RateLimitRefund[]): Promise<void> {
    for (const { hit, receipt } of refunds) {
      const state = this.states.get(hit.key);
      if (state) state.value = ALGORITHMS[hit.algorithm].refund(state.value, hit, receipt.admittedAt);
    }
    return Promise.resolve();
  }

  /** Number of keys held; for tests and diagnostics. */
  get size(): number {
    return this.states.size;
  }
}

import { LRUCache } from 'lru-cache';
import type { AlgorithmStep } from '../algorithms/algorithm.js';
import { ALGORITHMS } from '../algorithms/algorithms.js';
import { keysBeside } from './key-layout.js';
import { GRACE_MS, type RateLimitHit, claimMs } from './rate-limit-store.js';

/** An algorithm's step as the memory store decides with it. */
export type Step = Pick<AlgorithmStep<unknown>, 'allowed' | 'remaining' | 'resetMs'> & {
  next?: unknown;
  ttlMs?: number;
  blocked?: boolean;
  provisional?: boolean;
};

/** A `countOn` admission whose response has not ended yet, or a `settleCost` one's claim. */
interface InFlight {
  units: number;
  admittedAt: number;
}

/**
 * The memory store's admissions in flight: a `countOn` rule's until its response settles, a
 * `settleCost` rule's claim until its cost is settled. They weigh on the key's later requests as
 * the Redis scripts weigh them.
 */
export class InFlightAdmissions {
  /**
   * Per pending key, the `countOn` and `settleCost` admissions in flight by nonce. An entry whose
   * settle never came lapses (a `countOn` one after a window, a claim after `claimMs`). A key
   * evicted early makes a `countOn` rule's rejections final sooner (a penalty may start), which
   * gives no budget back; it frees a `settleCost` rule's claims, which does: under a flood of more
   * than `maxKeys` identities in flight, their requests together may pass the budget by more than
   * one overdraft. (Redis keeps every claim.)
   */
  private readonly byKey: LRUCache<string, Map<string, InFlight>>;

  constructor(maxKeys: number) {
    this.byKey = new LRUCache({ max: maxKeys });
  }

  /** Forgets the admissions of a pending key (a reset). */
  forget(pendingKey: string): void {
    this.byKey.delete(pendingKey);
  }

  /**
   * Whether a refused `countOn` hit would be admitted but for the units of admissions still in
   * flight, as the Redis script decides it: provisional, no penalty, worth asking again.
   */
  provisional(hit: RateLimitHit, state: unknown, step: Step, now: number): boolean {
    const inFlight = this.byKey.get(keysBeside(hit.key).pendingKey);
    if (!inFlight) return false;
    this.dropUnsettled(inFlight, hit.windowMs, now);
    // Only admissions a refund could give back: a fixed window's since it started.
    const since = hit.algorithm === 'fixed-window' ? (step.next as { start: number }).start : now - hit.windowMs + 1;
    let units = 0;
    for (const admission of inFlight.values()) if (admission.admittedAt >= since) units += admission.units;
    if (units === 0) return false;
    return ALGORITHMS[hit.algorithm].step(state, { ...hit, cost: Math.max(0, hit.cost - units) }, now).allowed;
  }

  /**
   * An admitted `settleCost` hit, as the Redis script decides it: refused (provisionally, no
   * penalty) unless the budget holds it and every admission still in flight at its most.
   */
  withMost(hit: RateLimitHit, state: unknown, step: Step, now: number): Step {
    const inFlight = this.byKey.get(keysBeside(hit.key).pendingKey);
    if (!inFlight) return step;
    this.dropUnsettled(inFlight, claimMs(hit), now);
    let most = 0;
    for (const admission of inFlight.values()) most += admission.units;
    if (most === 0) return step;
    const worst: Step = ALGORITHMS[hit.algorithm].step(state, { ...hit, cost: hit.cost + most }, now);
    if (worst.allowed) return step;
    // As the Redis script answers it: nothing left while they run, which ends by their claims' end.
    return { allowed: false, remaining: 0, resetMs: Math.min(worst.resetMs, claimMs(hit)), provisional: true };
  }

  /** @param units what the admission holds in flight: a `countOn` one's cost, a `settleCost` one's overdraft. */
  /** @param lifetimeMs how long it holds unsettled: a `countOn` admission a window, a claim `claimMs`. */
  admit(hit: RateLimitHit, units: number, lifetimeMs: number, nonce: string, now: number): void {
    const { pendingKey } = keysBeside(hit.key);
    const inFlight = this.byKey.get(pendingKey) ?? new Map<string, InFlight>();
    this.dropUnsettled(inFlight, lifetimeMs, now);
    inFlight.set(nonce, { units, admittedAt: now });
    this.byKey.set(pendingKey, inFlight, { ttl: lifetimeMs + GRACE_MS });
  }

  end(hit: RateLimitHit, nonce: string): void {
    const { pendingKey } = keysBeside(hit.key);
    const inFlight = this.byKey.get(pendingKey);
    if (inFlight?.delete(nonce) && inFlight.size === 0) this.byKey.delete(pendingKey);
  }

  /** Admissions whose settle never came hold nothing after their lifetime (a window, or `claimMs`). */
  private dropUnsettled(inFlight: Map<string, InFlight>, lifetimeMs: number, now: number): void {
    for (const [nonce, admission] of inFlight) {
      if (admission.admittedAt <= now - lifetimeMs) inFlight.delete(nonce);
    }
  }
}

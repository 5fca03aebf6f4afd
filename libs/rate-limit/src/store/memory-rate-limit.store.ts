import { LRUCache } from 'lru-cache';
import { ALGORITHMS } from '../algorithms/algorithms.js';
import { EvictedStateSketch } from './evicted-state-sketch.js';
import { InFlightAdmissions, type Step } from './in-flight-admissions.js';
import { keysBeside } from './key-layout.js';
import {
  GRACE_MS,
  RateLimitStore,
  type RateLimitConsumption,
  type RateLimitHit,
  type RateLimitRefund,
  type RateLimitSettlement,
  type RateLimitStanding,
  capacityOf,
  claimMs,
} from './rate-limit-store.js';

/** A key's state, with what its eviction must not give back. */
interface HeldState {
  value: unknown;
  /**
   * Units in use after the last write. No algorithm's count rises without a write, so until
   * `until` the state never holds more.
   */
  used: number;
  /**
   * When the state stops mattering, on the store's clock, plus the grace the map keeps it for (a
   * clock that goes back finds it again).
   */
  until: number;
}

/**
 * Counters in this process: for the demo, tests and single-instance apps. The same algorithms
 * and all-or-nothing semantics as the Redis store. Not shared across instances: N instances admit
 * up to N times the limit.
 *
 * Memory is bounded by `maxKeys`: at most `maxKeys` counter states and `maxKeys` block penalties
 * in two LRU maps, and for each an {@link EvictedStateSketch} of at most `48 x maxKeys` doubles,
 * allocated at its first eviction. Eviction never gives budget back, whatever the number of
 * identities: an evicted key's units in use (and a block's end) go into the sketch, and a key
 * missing from its map is decided on a state rebuilt from what the sketch reads, never less strict
 * than the one evicted (a fixed window rebuilt so starts at the lookup).
 *
 * The price is false positives: a key the sketch reads too high is charged what the keys sharing
 * its cells held, or is blocked, until their states end, and no longer than its own rule's longest
 * state after the last eviction into its cells. That is rare while the evicted keys whose states
 * still matter number up to `maxKeys`. Under a flood of far more identities, those that do not fit
 * in the maps come to share what the sketch holds instead of each starting afresh: size `maxKeys`
 * for the keys active within a rule's window, or use Redis.
 */
export class MemoryRateLimitStore extends RateLimitStore {
  readonly description: string;
  override readonly shared = false;
  private readonly states: LRUCache<string, HeldState>;
  private readonly blockedUntil: LRUCache<string, number>;
  private readonly evictedStates: EvictedStateSketch;
  private readonly evictedBlocks: EvictedStateSketch;
  /** The `countOn` and `settleCost` admissions in flight. */
  private readonly inFlight: InFlightAdmissions;
  private sequence = 0;
  /** The time of the call under way, for the eviction callbacks. */
  private now = 0;
  /** The latest time any call came with: after a clock that went back, still after every write. */
  private latest = 0;

  constructor(maxKeys: number) {
    super();
    this.evictedStates = new EvictedStateSketch(maxKeys);
    this.evictedBlocks = new EvictedStateSketch(maxKeys);
    // Only an eviction drops what may still matter: an expired entry is over, a deleted or replaced
    // one superseded.
    this.states = new LRUCache({
      max: maxKeys,
      dispose: (held, key, reason) => {
        if (reason === 'evict') this.evictedStates.add(key, held.used, held.until, this.latest, this.now);
      },
    });
    this.blockedUntil = new LRUCache({
      max: maxKeys,
      dispose: (until, key, reason) => {
        if (reason === 'evict') this.evictedBlocks.add(key, 1, until, this.latest, this.now);
      },
    });
    this.inFlight = new InFlightAdmissions(maxKeys);
    this.description = `in-process memory store (up to ${maxKeys} keys; not shared across instances)`;
  }

  consume(hits: readonly RateLimitHit[], clock?: number): Promise<RateLimitConsumption> {
    const now = this.begin(clock);
    const steps: Step[] = hits.map((hit) => {
      if (hit.blockMs > 0) {
        const { blockKey } = keysBeside(hit.key);
        const until =
          this.blockedUntil.get(blockKey) ?? this.evictedBlocks.lookup(blockKey, hit.blockMs, now)?.until ?? 0;
        if (until > now) return { allowed: false, remaining: 0, resetMs: until - now, blocked: true };
      }
      const state = this.stateOf(hit, now);
      const step: Step = ALGORITHMS[hit.algorithm].step(state, hit, now);
      if (!step.allowed && hit.conditional) step.provisional = this.inFlight.provisional(hit, state, step, now);
      if (step.allowed && hit.overdraftBound !== undefined) return this.inFlight.withMost(hit, state, step, now);
      return step;
    });
    const allowed = steps.every((step) => step.allowed);
    const nonce = allowed ? String((this.sequence += 1)) : '';
    hits.forEach((hit, i) => {
      const step = steps[i];
      if (allowed) {
        this.hold(hit, step.next, step.remaining, step.ttlMs ?? 0, now);
        if (hit.conditional) this.inFlight.admit(hit, hit.cost, hit.windowMs, nonce, now);
        else if (hit.overdraftBound) this.inFlight.admit(hit, hit.overdraftBound, claimMs(hit), nonce, now);
      } else if (!step.allowed && !step.blocked && !step.provisional && hit.blockMs > 0) {
        this.blockedUntil.set(keysBeside(hit.key).blockKey, now + hit.blockMs, { ttl: hit.blockMs + GRACE_MS });
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
        // Set only when true, as the Redis store does.
        ...(steps[i].provisional ? { provisional: true } : {}),
      })),
      receipts: allowed ? hits.map(() => ({ admittedAt: now, nonce })) : undefined,
    });
  }

  override inspect(hits: readonly RateLimitHit[], clock?: number): Promise<RateLimitStanding[]> {
    const now = this.begin(clock);
    return Promise.resolve(
      hits.map((hit) => {
        const until = hit.blockMs > 0 ? (this.blockedUntil.peek(keysBeside(hit.key).blockKey) ?? 0) : 0;
        const state = this.stateOf(hit, now);
        const { remaining, resetMs } = ALGORITHMS[hit.algorithm].step(state, { ...hit, cost: 0 }, now);
        return {
          remaining,
          resetMs: remaining >= capacityOf(hit) ? 0 : resetMs,
          blockedMs: Math.max(0, until - now),
        };
      }),
    );
  }

  record(hits: readonly RateLimitHit[], clock?: number): Promise<void> {
    const now = this.begin(clock);
    for (const hit of hits) {
      const algorithm = ALGORITHMS[hit.algorithm];
      const step = algorithm.step(this.stateOf(hit, now), hit, now);
      // A refused step reports what was left before its units; what is left after them is wanted.
      const remaining = step.allowed ? step.remaining : algorithm.step(step.next, { ...hit, cost: 0 }, now).remaining;
      this.hold(hit, step.next, remaining, step.ttlMs, now);
      if (hit.settles !== undefined) this.inFlight.end(hit, hit.settles);
    }
    return Promise.resolve();
  }

  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    for (const { hit, receipt, refund } of settlements) {
      this.inFlight.end(hit, receipt.nonce);
      if (!refund) continue;
      // An evicted key's units stay in the sketch: its refund is lost, on the safe side. `used`
      // stays too: a refund only lowers the state, so it still bounds it.
      const held = this.states.get(hit.key);
      if (held) held.value = ALGORITHMS[hit.algorithm].refund(held.value, hit, receipt.admittedAt);
    }
    return Promise.resolve();
  }

  override renewSlots(slots: readonly RateLimitRefund[], clock?: number): Promise<(number | undefined)[]> {
    const now = this.begin(clock);
    return Promise.resolve(
      slots.map(({ hit, receipt }) => {
        const held = this.states.get(hit.key);
        const algorithm = ALGORITHMS[hit.algorithm];
        const renewed = held && algorithm.renew?.(held.value, receipt.admittedAt, now);
        if (!renewed) return undefined;
        const { remaining, ttlMs } = algorithm.step(renewed, { ...hit, cost: 0 }, now);
        this.hold(hit, renewed, remaining, ttlMs, now);
        return Math.max(now, receipt.admittedAt);
      }),
    );
  }

  /**
   * Deleted, not evicted: nothing of them goes into the sketches. What an earlier eviction put
   * there stays (a sketch forgets nothing early), so a key evicted under a flood may stay charged
   * until the state it lost would have ended.
   */
  reset(keys: readonly string[]): Promise<void> {
    for (const key of keys) {
      const { blockKey, pendingKey } = keysBeside(key);
      this.states.delete(key);
      this.blockedUntil.delete(blockKey);
      this.inFlight.forget(pendingKey);
    }
    return Promise.resolve();
  }

  /** Counter states held (at most `maxKeys`); for tests and diagnostics. */
  get size(): number {
    return this.states.size;
  }

  /** Block penalties held (at most `maxKeys`); for tests and diagnostics. */
  get blockCount(): number {
    return this.blockedUntil.size;
  }

  private begin(clock: number | undefined): number {
    // Whole milliseconds, as the Redis scripts use.
    this.now = Math.floor(clock ?? Date.now());
    this.latest = Math.max(this.latest, this.now);
    return this.now;
  }

  /** The key's state; for a key evicted from the map, one at least as strict, rebuilt from the sketch. */
  private stateOf(hit: RateLimitHit, now: number): unknown {
    const held = this.states.get(hit.key);
    if (held) return held.value;
    // Most keys missing from the map were never evicted: only for those the sketch may hold is the
    // rule's lifetime worked out (a sliding log builds a full log for it).
    if (!this.evictedStates.lookup(hit.key, Infinity, now)) return undefined;
    const algorithm = ALGORITHMS[hit.algorithm];
    const capacity = capacityOf(hit);
    // A full state written at 0, where every window starts, is the one that matters longest.
    const lifetimeMs = algorithm.step(undefined, { ...hit, cost: capacity }, 0).ttlMs + GRACE_MS;
    const evicted = this.evictedStates.lookup(hit.key, lifetimeMs, now);
    if (!evicted) return undefined;
    // Beyond the capacity, units only tell of another rule's key sharing the cells.
    const params = { ...hit, cost: Math.min(evicted.units, capacity) };
    // Rebuilt as the units taken at one instant: in every algorithm, that leaves a key no more than
    // the same units taken earlier did. The instant is the latest time seen (not `now`: after a
    // clock that went back, the units must not be dated before the writes they stand for), or, if
    // earlier, one that makes them matter until 1 ms after the evicted state did: that keeps a
    // sliding window's units in the window they were counted in, and a log's or a bucket's from
    // lasting longer than they did. Not for a fixed window: one begun before the lookup would end
    // before the window a key read by mistake (a false positive) really has, and give it budget
    // back in the next one.
    let at = this.latest;
    if (hit.algorithm !== 'fixed-window') {
      at = Math.min(at, evicted.until - GRACE_MS + 1 - algorithm.step(undefined, params, 0).ttlMs);
    }
    return algorithm.step(undefined, params, at).next;
  }

  private hold(hit: RateLimitHit, value: unknown, remaining: number, ttlMs: number, now: number): void {
    // Kept as long as the state matters (plus the same grace as in Redis), then freed.
    const held: HeldState = { value, used: capacityOf(hit) - remaining, until: now + ttlMs + GRACE_MS };
    this.states.set(hit.key, held, { ttl: ttlMs + GRACE_MS });
  }
}

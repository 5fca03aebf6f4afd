import { LRUCache } from 'lru-cache';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  capacityOf,
  unaskedDecision,
} from '../store/rate-limit-store.js';
import {
  type DecidingStore,
  DecidingStoreLayer,
  type HitHandling,
  type ResilientConsumption,
  type StoreObserver,
} from './deciding-store.js';

/**
 * The block cache as a layer: keys a shared store refused are refused here until the reset it
 * reported (`BlockedKeys`), and calls of one key wait while those in flight may reach its limit
 * (`KeysInFlight`), so an attack on one key costs the store about one call per key per window per
 * instance. Wired only for a store that tells every instance of lowered counts.
 */
export class BlockCacheStore extends DecidingStoreLayer {
  private readonly inFlight = new KeysInFlight();

  /** @param clock the module's `clock`, if it has one: the time of the calls. */
  constructor(
    inner: DecidingStore,
    private readonly blocked: BlockedKeys,
    private readonly clock: (() => number) | undefined,
    /** The `DECISION_OBSERVER` of `rateLimitMetrics()`; unset by default. */
    private readonly observer: StoreObserver | undefined,
  ) {
    super(inner);
  }

  /** Every hit asked below unless the block cache knows the answer: nearly every request's path. */
  consume(hits: readonly RateLimitHit[], rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    return this.decide(hits, rules, now, false);
  }

  attempt(hits: readonly RateLimitHit[], rules: readonly HitHandling[], now?: number): Promise<ResilientConsumption> {
    return this.decide(hits, rules, now, true);
  }

  /** @param raw a store failure rejects (`attempt`) instead of being decided by the policies. */
  private decide(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
    raw: boolean,
  ): Promise<ResilientConsumption> {
    // The block cache's time: the module's clock (as the store decides on it), else this process's.
    const sentAt = now ?? performance.now();
    const refused = this.blocked.refusal(hits, sentAt);
    if (refused) {
      this.observer?.blockCacheHit();
      return Promise.resolve(refused);
    }
    const waiting = this.inFlight.enter(hits);
    if (waiting) return this.consumeHeld(hits, rules, now, waiting, raw);
    return this.askEntered(hits, rules, now, sentAt, raw);
  }

  reset(keys: readonly string[]): Promise<void> {
    this.blocked.forget(keys);
    return this.inner.reset(keys);
  }

  /** A call held by `KeysInFlight`: asks the block cache again after each answer it waited for. */
  private async consumeHeld(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
    waiting: Promise<unknown>,
    raw: boolean,
  ): Promise<ResilientConsumption> {
    let at = now;
    for (;;) {
      const error = await waiting;
      // The call waited for failed: so does this one, which never reached the store.
      if (error !== undefined) {
        this.inFlight.leave(hits);
        if (raw) throw error;
        return this.inner.decideFailed(hits, rules, error, at, true);
      }
      // Read again after a wait: a block must not be judged on a time from before it.
      at = this.clock ? Math.floor(this.clock()) : now;
      const sentAt = at ?? performance.now();
      const refused = this.blocked.refusal(hits, sentAt);
      if (refused) {
        this.inFlight.leave(hits);
        this.observer?.blockCacheHit();
        return refused;
      }
      const next = this.inFlight.enter(hits);
      if (!next) return this.askEntered(hits, rules, at, sentAt, raw);
      waiting = next;
    }
  }

  /** One call below for hits `KeysInFlight` let go; its refusals kept, the calls held on its keys woken. */
  private askEntered(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
    sentAt: number,
    raw: boolean,
  ): Promise<ResilientConsumption> {
    const since = this.blocked.since;
    const answered = (consumption: ResilientConsumption) => {
      if (consumption.storeError === undefined) {
        this.blocked.learn(hits, consumption, sentAt, since);
        this.inFlight.answered(hits, consumption);
      } else {
        this.inFlight.answered(hits, undefined, consumption.failure);
      }
      return consumption;
    };
    if (!raw) return this.inner.consume(hits, rules, now).then(answered);
    return this.inner.attempt(hits, rules, now).then(answered, (error: unknown) => {
      this.inFlight.answered(hits, undefined, error);
      throw error;
    });
  }
}

/**
 * A key the store refused with nothing left, until the time it said a hit would be admitted (on
 * the clock of the calls), for the limit then (another limit is another question) and the cost
 * refused (a cheaper hit may fit sooner).
 */
type Block = { until: number; limit: number; cost: number };

/**
 * Keys a shared store refused, remembered until the reset it reported. Only refusals that leave
 * nothing (`remaining` 0) are kept, and a hit is refused here only when it costs at least what was
 * refused: a store's decision for a key improves only with time, or by a refund, a reset or a
 * higher limit, and each lifts the block (`forget`, told by the store for every instance, or the
 * limit compared on every hit). Blocks are kept only while that news reaches this instance
 * (`listening`), and never for `countOn` rules, which refund by design.
 * Times are taken from before the store's call was sent, so a block ends no later than the store's.
 */
export class BlockedKeys {
  private readonly blocks: LRUCache<string, Block>;
  /** Only while news of lifted keys reaches this instance (`listening`). */
  private enabled = false;
  /** Moves on every forgetting: a store's answer sent before one may predate a reset. */
  private generation = 0;

  constructor(maxKeys: number) {
    this.blocks = new LRUCache({ max: maxKeys });
  }

  /**
   * The store's decision again, for a request with a hit known to be refused at `now`; undefined
   * when it must ask. The other hits were not asked: they read as admitting with their full limit.
   */
  refusal(hits: readonly RateLimitHit[], now: number): RateLimitConsumption | undefined {
    if (!this.enabled || this.blocks.size === 0) return undefined;
    let refused: (RateLimitDecision | undefined)[] | undefined;
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const block = this.blocks.get(hit.key);
      if (!block || hit.conditional || hit.cost < block.cost || block.limit !== hit.limit || block.until <= now)
        continue;
      refused ??= [];
      refused[i] = { allowed: false, limit: hit.limit, remaining: 0, resetMs: Math.ceil(block.until - now) };
    }
    if (!refused) return undefined;
    const decisions = hits.map((hit, i): RateLimitDecision => refused![i] ?? unaskedDecision(hit));
    return { allowed: false, decisions, receipts: undefined };
  }

  /** Where forgetting stands: pass it to `learn` for a call sent now. */
  get since(): number {
    return this.generation;
  }

  /**
   * Keeps the refusals of a store's answer to a call sent at `sentAt`, when `since` was `since`:
   * unless keys were forgotten meanwhile, since the answer may predate their reset.
   */
  learn(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, sentAt: number, since: number): void {
    if (!this.enabled || consumption.allowed || since !== this.generation) return;
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const decision = consumption.decisions[i];
      if (decision.allowed || decision.provisional || decision.remaining > 0 || !held(hit)) continue;
      this.blocks.set(hit.key, { until: sentAt + decision.resetMs, limit: hit.limit, cost: hit.cost });
    }
  }

  /** Keys reset or refunded: the store may admit them again. */
  forget(keys: readonly string[]): void {
    if (keys.length === 0) return;
    this.generation += 1;
    for (const key of keys) this.blocks.delete(key);
  }

  /**
   * Whether news of lifted keys reaches this instance. Either way every block goes: some may have
   * been lifted unseen. None is kept or served until it does.
   */
  listening(on: boolean): void {
    this.generation += 1;
    this.blocks.clear();
    this.enabled = on;
  }
}

/** One key's calls that the store has not answered yet. */
interface KeyInFlight {
  /** Units of this key in those calls. */
  units: number;
  /** What the store last said was left of the key, while calls have been in flight; unknown before. */
  left: number | undefined;
  /** Calls held until one of this key's is answered: woken with the error when it failed. */
  waiting: ((error: unknown) => void)[] | undefined;
}

/**
 * Keeps a burst on one key (a GraphQL request with thousands of aliases, an attack's concurrent
 * requests) from all reaching the store before its first refusal is kept. A call goes at once while
 * none of its keys has units in flight, or while those and its own fit in what the store last said
 * was left (the limit, before it said anything); otherwise it is held until a call of that key is
 * answered, then asks the block cache again. So a burst costs the store about one call per unit the
 * limit admits, plus one that learns the refusal.
 *
 * It only orders calls, never decides one: a stale figure (another instance consumed since, a window
 * ended) only makes a call wait one answer longer. Only hits the block cache can refuse are held
 * (not `countOn` hits, not free ones), and traffic over many keys, or on a key far from its limit,
 * never waits.
 */
class KeysInFlight {
  private readonly keys = new Map<string, KeyInFlight>();

  /**
   * Enters a call of `hits` when it may go now (returns undefined; call `answered` after it), or
   * returns a promise that resolves once it should ask the block cache and `enter` again; with the
   * error of the call it waited for, if that failed: then it shares that failure instead of waiting
   * out another deadline.
   */
  enter(hits: readonly RateLimitHit[]): Promise<unknown> | undefined {
    for (const hit of hits) {
      if (!held(hit)) continue;
      const inFlight = this.keys.get(hit.key);
      if (inFlight && inFlight.units > 0 && inFlight.units + hit.cost > (inFlight.left ?? capacityOf(hit))) {
        return new Promise((resolve) => (inFlight.waiting ??= []).push(resolve));
      }
    }
    for (const hit of hits) {
      if (!held(hit)) continue;
      const inFlight = this.keys.get(hit.key);
      if (inFlight) inFlight.units += hit.cost;
      else this.keys.set(hit.key, { units: hit.cost, left: undefined, waiting: undefined });
    }
    return undefined;
  }

  /**
   * A call that `enter` let go has ended: with the store's answer, or with the error it failed with.
   * Wakes the calls held on its keys.
   */
  answered(hits: readonly RateLimitHit[], consumption: RateLimitConsumption | undefined, error?: unknown): void {
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const inFlight = held(hit) ? this.keys.get(hit.key) : undefined;
      if (!inFlight) continue;
      inFlight.units -= hit.cost;
      if (consumption) inFlight.left = consumption.decisions[i].remaining;
      const { waiting } = inFlight;
      if (!waiting) {
        if (inFlight.units === 0) this.keys.delete(hit.key);
        continue;
      }
      // All of them ask again, in the order they came: the first ones go, the rest are held again
      // or refused by the block cache (`leave`). The entry stays for them: it holds what was left.
      inFlight.waiting = undefined;
      for (const wake of waiting) wake(error);
    }
  }

  /** A call that was held is decided without the store after all (the block cache refused it). */
  leave(hits: readonly RateLimitHit[]): void {
    for (const hit of hits) {
      const inFlight = this.keys.get(hit.key);
      if (inFlight && inFlight.units === 0 && !inFlight.waiting) this.keys.delete(hit.key);
    }
  }
}

/**
 * Hits the block cache can refuse: others gain nothing from waiting for an answer. Not `countOn`'s,
 * whose refusal may be provisional, nor a cap's, which lasts only until one of its requests ends.
 * (Read here, not through `givenBack`: this file is on every request's path, that one is not.)
 */
function held(hit: RateLimitHit): boolean {
  return !hit.conditional && !hit.slot && hit.cost > 0;
}

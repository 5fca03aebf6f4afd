import type { RateLimitHit } from '../store/rate-limit-store.js';
import type { BlockedKeys } from './blocked-keys.js';
import {
  type DecidingStore,
  DecidingStoreLayer,
  type HitHandling,
  type ResilientConsumption,
  type StoreObserver,
} from './deciding-store.js';
import { KeysInFlight } from './keys-in-flight.js';

/**
 * The block cache as a layer: keys a shared store refused are refused here until the reset it
 * reported (`BlockedKeys`), and calls of one key wait while those in flight may reach its limit
 * (`KeysInFlight`), so an attack on one key costs the store about one call per key per window per
 * instance. Wired only for a store that tells every instance of lowered counts (`watching`).
 */
export class BlockCacheStore extends DecidingStoreLayer {
  private readonly inFlight = new KeysInFlight();

  /**
   * @param blocked told by the store of the keys any instance lowered (the module wires that).
   * @param clock the module's `clock`, if it has one: the time of the calls.
   */
  constructor(
    inner: DecidingStore,
    private readonly blocked: BlockedKeys,
    private readonly clock: (() => number) | undefined,
    private readonly observer: StoreObserver | undefined,
  ) {
    super(inner);
  }

  /**
   * Every hit asked below, unless the block cache knows the answer. Without a wait, one promise
   * beyond the layer below's: this is the path nearly every request takes.
   */
  consume(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption> {
    return this.decide(hits, rules, now, false);
  }

  attempt(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption> {
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

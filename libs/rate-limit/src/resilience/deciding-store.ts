import type {
  RateLimitConsumption,
  RateLimitHit,
  RateLimitRefund,
  RateLimitSettlement,
  RateLimitStanding,
} from '../store/rate-limit-store.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

/** What of a hit's rule the layers above the store need: a `RateLimitRule` is one. */
export interface HitHandling {
  /** The rule's own store-error policy, if it names one. */
  readonly onStoreError: RateLimitStoreErrorPolicy | undefined;
  /** Units taken from a shared store at once (`LeasingStore`); 0: none. */
  readonly lease: number;
}

/** A consumption, and when the store failed, the policy that decided it instead. */
export interface ResilientConsumption extends RateLimitConsumption {
  storeError?: RateLimitStoreErrorPolicy;
  /** With `storeError`: what the store failed with. */
  failure?: unknown;
}

/** What metrics learn of the store as the limiter uses it. */
export interface StoreObserver {
  /** A consume call ended, after `seconds`; `error` when it failed. */
  called(seconds: number, error: unknown): void;
  /** Refused by the block cache, without a store call. */
  blockCacheHit(): void;
}

/**
 * The store as the limiter uses it: a request is always decided, by the store or, when it fails,
 * by the store-error policies. The module wiring stacks it from layers, each present only when it
 * is configured (`module/limiter-provider.ts`):
 *
 *     [BlockCacheStore] -> ResilientStore -> the RateLimitStore
 *
 * Each layer holds one concern and passes the rest to the one below it. `LeasingStore` sits on top
 * of that stack as a provider of its own, which the limiter takes only for a request with a leased
 * rule.
 */
export abstract class DecidingStore {
  abstract readonly description: string;
  /** Decides all hits of a request; never rejects for a store failure (the policies decide then). */
  abstract consume(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption>;
  /**
   * `consume`, but a store failure rejects with its error, for a layer above that decides the
   * request by the policies itself (`decideFailed`), with hits it did not ask of the store.
   */
  abstract attempt(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    now: number | undefined,
  ): Promise<ResilientConsumption>;
  /**
   * Decides by the policies a request the store could not decide: it failed with `error`.
   * @param unsent whether the request certainly never reached the store (what the fallback admits
   *   is then recorded in it later); by default, what the store says of the error.
   */
  abstract decideFailed(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    error: unknown,
    now: number | undefined,
    unsent?: boolean,
  ): Promise<ResilientConsumption>;
  abstract settle(settlements: readonly RateLimitSettlement[]): Promise<void>;
  /**
   * Counts units past any limit, deciding nothing: what requests cost beyond what they reserved
   * (`settleCost`), each hit's `cost` the overdraft of the admission its receipt names, whose
   * claim in flight ends with it. Rejects when the store fails.
   */
  abstract charge(charges: readonly RateLimitRefund[], now: number | undefined): Promise<void>;
  /** The store's own reading: an operator's question, answered by the store or not at all. */
  abstract inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]>;
  /** Forgets the keys in every layer, then in the store. */
  abstract reset(keys: readonly string[]): Promise<void>;
}

/** A layer: passes to the one below it what it does not handle itself. */
export abstract class DecidingStoreLayer extends DecidingStore {
  constructor(protected readonly inner: DecidingStore) {
    super();
  }

  get description(): string {
    return this.inner.description;
  }

  decideFailed(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    error: unknown,
    now: number | undefined,
    unsent?: boolean,
  ): Promise<ResilientConsumption> {
    return this.inner.decideFailed(hits, rules, error, now, unsent);
  }

  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    return this.inner.settle(settlements);
  }

  charge(charges: readonly RateLimitRefund[], now: number | undefined): Promise<void> {
    return this.inner.charge(charges, now);
  }

  inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]> {
    return this.inner.inspect(hits, now);
  }
}

import { type StoreProblemLog, describeError } from '../logging/store-problem-log.js';
import type {
  RateLimitConsumption,
  RateLimitDecision,
  RateLimitHit,
  RateLimitSettlement,
  RateLimitStore,
} from '../store/rate-limit-store.js';
import { BlockedKeys } from './blocked-keys.js';
import { LocalFallback, type LocalFallbackOptions } from './local-fallback.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

/** Retry-After for requests refused because the store failed under the policy `'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

export interface ResilienceOptions {
  /** The module's `storeErrors.policy`, for hits whose rule names none. */
  policy: RateLimitStoreErrorPolicy;
  localFallback: LocalFallbackOptions;
  /** Keys refused kept at most (`BlockedKeys`), or false for none. */
  blockCache: { maxKeys: number } | false;
}

/** A consumption, and when the store failed, the policy that decided it instead. */
export interface ResilientConsumption extends RateLimitConsumption {
  storeError?: RateLimitStoreErrorPolicy;
}

/**
 * The store as the limiter uses it: the configured store, and around a shared one (Redis) what
 * keeps requests decided while it fails. A failed call (an error, a missed deadline, an open
 * circuit) is decided by each rule's store-error policy (its `onStoreError`, else the module's
 * `storeErrors.policy`): `'deny'` refuses, `'allow'` admits, and
 * `'local'` rules are decided together by the local fallback, from what the store last reported.
 * Once the store answers again, what the fallback admitted meanwhile is recorded in it.
 *
 * A store in this process (`shared: false`) has no fallback and nothing to record: should it fail,
 * `'local'` rules admit as `'allow'` ones do.
 */
export class ResilientStore {
  private readonly fallback: LocalFallback | undefined;
  private readonly blocked: BlockedKeys | undefined;

  constructor(
    private readonly store: RateLimitStore,
    private readonly problems: StoreProblemLog,
    private readonly options: ResilienceOptions,
  ) {
    if (store.shared) this.fallback = new LocalFallback(options.localFallback);
    if (store.shared && options.blockCache) {
      const blocked = new BlockedKeys(options.blockCache.maxKeys);
      // Kept only if every instance's resets and refunds reach this one, so none stays refused here.
      const watching = store.watchLiftedKeys({
        lifted: (keys) => blocked.forget(keys),
        listening: (on) => blocked.listening(on),
      });
      if (watching) this.blocked = blocked;
    }
  }

  get description(): string {
    return this.store.description;
  }

  /**
   * @param policies each hit's rule's own `onStoreError`, if it names one.
   */
  async consume(
    hits: readonly RateLimitHit[],
    policies: readonly (RateLimitStoreErrorPolicy | undefined)[],
    now?: number,
  ): Promise<ResilientConsumption> {
    // The block cache's time: the module's clock (as the store decides on it), else this process's.
    const sentAt = now ?? performance.now();
    const since = this.blocked?.since ?? 0;
    if (this.blocked) {
      const refused = this.blocked.refusal(hits, sentAt);
      if (refused) return refused;
    }
    let consumption: RateLimitConsumption;
    try {
      consumption = await this.store.consume(hits, now);
    } catch (error) {
      return this.decideWithout(
        hits,
        policies.map((policy) => policy ?? this.options.policy),
        error,
        now ?? Date.now(),
      );
    }
    this.blocked?.learn(hits, consumption, sentAt, since);
    if (this.fallback) {
      const at = now ?? Date.now();
      this.fallback.remember(hits, consumption, at);
      if (this.fallback.hasPending) void this.recordFallbackUnits(now);
    }
    return consumption;
  }

  /** Only `countOn` admissions are settled here, and the block cache keeps none of theirs. */
  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    return this.store.settle(settlements);
  }

  async reset(keys: readonly string[]): Promise<void> {
    this.fallback?.forget(keys);
    this.blocked?.forget(keys);
    await this.store.reset(keys);
  }

  /**
   * Decides a request the store could not: `'deny'` if any rule denies; otherwise `'local'` rules
   * are decided together by this instance and `'allow'` rules admit.
   */
  private async decideWithout(
    hits: readonly RateLimitHit[],
    policies: readonly RateLimitStoreErrorPolicy[],
    error: unknown,
    now: number,
  ): Promise<ResilientConsumption> {
    const reason = describeError(error);
    this.problems.report(
      reason,
      `Rate-limit store failed (${reason}); requests decided by the store-error policy '${[...new Set(policies)].join('/')}'`,
    );
    const denied = policies.includes('deny');
    const localIndices = denied ? [] : policies.flatMap((policy, i) => (policy === 'local' ? [i] : []));
    const local =
      localIndices.length > 0 && this.fallback
        ? await this.fallback.consume(
            localIndices.map((i) => hits[i]),
            now,
            this.store.neverReached(error),
          )
        : undefined;
    const allowed = !denied && (local?.allowed ?? true);
    const decisions = hits.map((hit, i): RateLimitDecision => {
      const localAt = localIndices.indexOf(i);
      if (local && localAt >= 0) return local.decisions[localAt];
      const refused = policies[i] === 'deny' || (policies[i] === 'local' && !allowed);
      return refused
        ? { allowed: policies[i] !== 'deny' && allowed, limit: hit.limit, remaining: 0, resetMs: STORE_ERROR_RETRY_MS }
        : { allowed: true, limit: hit.limit, remaining: hit.limit, resetMs: hit.windowMs };
    });
    return { allowed, decisions, receipts: undefined, storeError: policyOf(policies) };
  }

  /**
   * The store answers again: records in it what the fallback admitted meanwhile (for windows not
   * over yet), so those requests count against the limit there too. Never throws.
   */
  private async recordFallbackUnits(now: number | undefined): Promise<void> {
    const hits = this.fallback!.takePending(now ?? Date.now());
    try {
      for (let i = 0; i < hits.length; i += 100) await this.store.record(hits.slice(i, i + 100), now);
    } catch (error) {
      const reason = describeError(error);
      this.problems.report(`record:${reason}`, `Recording requests the fallback admitted failed (${reason})`);
    }
  }
}

/** The policy that decided a request the store could not: 'deny' if any rule denies. */
function policyOf(policies: readonly RateLimitStoreErrorPolicy[]): RateLimitStoreErrorPolicy {
  if (policies.includes('deny')) return 'deny';
  return policies.includes('local') ? 'local' : 'allow';
}

import type { InjectionToken, Provider } from '@nestjs/common';
import { DECISION_OBSERVER, type DecisionObserver } from '../limiter/decision-observer.js';
import type { StepEntry } from '../limiter/limiter-step.js';
import { LimiterSteps } from '../limiter/limiter-steps.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { BlockCacheStore, BlockedKeys } from '../resilience/block-cache.store.js';
import type { DecidingStore } from '../resilience/deciding-store.js';
import { ResilientStore } from '../resilience/resilient-store.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { limiterSteps } from './limiter-steps.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from './options.js';
import { storeProblemLog } from './store-providers.js';

/**
 * The store as the limiter uses it, from the layers the options ask for (`resilience/`): the
 * `storeErrors` policies and the local fallback around the store; and the block cache on them,
 * for a shared store that tells every instance of lowered counts.
 */
function decidingStore(
  store: RateLimitStore,
  problems: StoreProblemLog,
  { storeErrors, memoryStore, blockCache, clock }: ResolvedRateLimitOptions,
  observer: DecisionObserver | undefined,
  redis: RedisService,
): DecidingStore {
  let blocked: BlockedKeys | undefined;
  const resilient = new ResilientStore(store, problems, {
    policy: storeErrors.policy,
    localFallback: {
      ...storeErrors.localFallback,
      maxKeys: memoryStore.maxKeys,
      instances: store instanceof RedisRateLimitStore ? () => redis.news.instances : undefined,
      storeSeemsDown: store instanceof RedisRateLimitStore ? () => redis.runner.seemsDown : undefined,
      // Units Redis counted for requests refused here, which this instance may admit with.
      banked: (key) => blocked?.forget([key]),
    },
    observer,
  });
  // Keys reset or refunded anywhere are forgotten by the fallback too; and listening is how the
  // instances are counted.
  store.watchLiftedKeys({ lifted: (keys) => resilient.forget(keys), listening: () => undefined });
  if (!store.shared || !blockCache) return resilient;
  const blockedKeys = new BlockedKeys(blockCache.maxKeys);
  blocked = blockedKeys;
  const watching = store.watchLiftedKeys({
    lifted: (keys) => blockedKeys.forget(keys),
    listening: (on) => blockedKeys.listening(on),
  });
  return watching ? new BlockCacheStore(resilient, blockedKeys, clock, observer) : resilient;
}

/**
 * The limiter, with what it alone uses made here: the store stack it decides with (`decidingStore`)
 * and its steps (`limiterSteps`), the extensions' last. The observer is an extension's
 * (`DECISION_OBSERVER`), or none.
 */
export function limiterProvider(extensionSteps: readonly InjectionToken[]): Provider {
  return {
    provide: RateLimiterService,
    inject: [
      RESOLVED_RATE_LIMIT_OPTIONS,
      RateLimitStore,
      RedisService,
      RateLimitRuleRegistry,
      RateLimitConfigCentre,
      { token: DECISION_OBSERVER, optional: true },
      ...extensionSteps,
    ],
    useFactory: (
      options: ResolvedRateLimitOptions,
      store: RateLimitStore,
      redis: RedisService,
      registry: RateLimitRuleRegistry,
      centre: RateLimitConfigCentre,
      observer: DecisionObserver | undefined,
      ...steps: StepEntry[]
    ): RateLimiterService => {
      const problems = storeProblemLog(redis);
      const deciding = decidingStore(store, problems, options, observer ?? undefined, redis);
      const composed = new LimiterSteps(limiterSteps(options, deciding, store, centre, steps));
      return new RateLimiterService(options, deciding, problems, registry, centre, composed);
    },
  };
}

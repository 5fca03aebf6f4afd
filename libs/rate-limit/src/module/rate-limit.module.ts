import { type DynamicModule, Logger, Module, type Provider } from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import { APP_GUARD, DiscoveryModule, ModuleRef } from '@nestjs/core';
import { NestConfigCentre } from '../config-centre/nest-config-centre.js';
import { RateLimitConfigCentre } from '../config-centre/rate-limit-config-centre.js';
import { RateLimitGuard } from '../http/rate-limit.guard.js';
import { RateLimitInterceptor } from '../http/rate-limit.interceptor.js';
import { RATE_LIMIT_OPTIONS, RateLimitConfigurableModule } from './module-definition.js';
import {
  RESOLVED_RATE_LIMIT_OPTIONS,
  type RateLimitModuleAsyncOptions,
  type RateLimitModuleExtras,
  type RateLimitModuleOptions,
  type ResolvedRateLimitOptions,
} from './options.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import { StoreProblemLog } from '../logging/store-problem-log.js';
import { LostWriteCheck } from '../redis/failover/lost-write-check.js';
import { ReplicaWait } from '../redis/failover/replica-wait.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { ResilientStore } from '../resilience/resilient-store.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { resolveModuleOptions } from './resolve-options.js';
import { LEASE_MAX_KEYS } from './defaults.js';

const resolvedOptionsProvider: Provider = {
  provide: RESOLVED_RATE_LIMIT_OPTIONS,
  inject: [RATE_LIMIT_OPTIONS],
  useFactory: resolveModuleOptions,
};

const problemLogProvider: Provider = {
  provide: StoreProblemLog,
  inject: [RESOLVED_RATE_LIMIT_OPTIONS],
  useFactory: ({ logging }: ResolvedRateLimitOptions) => new StoreProblemLog(logging ? logging.intervalMs : undefined),
};

/**
 * The store itself: yours, the in-process one, or Redis with the failover defences the options
 * ask for (the lost-write check, the marker, the replica wait; `redis/failover/`).
 */
const storeProvider: Provider = {
  provide: RateLimitStore,
  inject: [RATE_LIMIT_OPTIONS, RESOLVED_RATE_LIMIT_OPTIONS, RedisService, StoreProblemLog, ModuleRef],
  useFactory: async (
    { store }: RateLimitModuleOptions,
    options: ResolvedRateLimitOptions,
    redis: RedisService,
    problems: StoreProblemLog,
    moduleRef: ModuleRef,
  ): Promise<RateLimitStore> => {
    if (store instanceof RateLimitStore) return store;
    if (typeof store === 'function') return moduleRef.create(store);
    const { maxKeys } = options.memoryStore;
    if (!redis.isConfigured) return new MemoryRateLimitStore(maxKeys);
    const { detectLostWrites, marker, waitForReplicas } = options.failover;
    return new RedisRateLimitStore(redis, problems, {
      lostWrites: detectLostWrites ? new LostWriteCheck(maxKeys, problems) : undefined,
      marker,
      replicaWait: waitForReplicas ? new ReplicaWait(redis, waitForReplicas, problems) : undefined,
    });
  },
};

/** The store as the limiter uses it: `storeErrors` policies and the local fallback around it. */
const resilientStoreProvider: Provider = {
  provide: ResilientStore,
  inject: [RateLimitStore, StoreProblemLog, RESOLVED_RATE_LIMIT_OPTIONS],
  useFactory: (
    store: RateLimitStore,
    problems: StoreProblemLog,
    { storeErrors, memoryStore, blockCache, clock }: ResolvedRateLimitOptions,
  ) =>
    new ResilientStore(store, problems, {
      policy: storeErrors.policy,
      localFallback: { ...storeErrors.localFallback, maxKeys: memoryStore.maxKeys },
      blockCache,
      leaseKeys: LEASE_MAX_KEYS,
      clock,
    }),
};

const configCentreProvider: Provider = {
  provide: RateLimitConfigCentre,
  inject: [RATE_LIMIT_OPTIONS, ModuleRef, { token: ConfigService, optional: true }],
  useFactory: async (
    options: RateLimitModuleOptions,
    moduleRef: ModuleRef,
    config: ConfigService | undefined,
  ): Promise<RateLimitConfigCentre> => {
    const { configCentre } = options;
    if (configCentre instanceof RateLimitConfigCentre) return configCentre;
    if (typeof configCentre === 'function') return moduleRef.create(configCentre);
    if (!config) {
      new Logger('RateLimit').log('ConfigModule is not imported: thresholds are read from process.env only');
    }
    return new NestConfigCentre(config ?? new ConfigService());
  },
};

/**
 * Distributed rate limiting: `imports: [RateLimitModule.forRoot({ redis: process.env.REDIS_URL })]`,
 * then `@RateLimit()` on controllers or handlers. Without `redis`, counters live in this process.
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    resolvedOptionsProvider,
    RedisService,
    problemLogProvider,
    storeProvider,
    resilientStoreProvider,
    configCentreProvider,
    RateLimitRuleRegistry,
    RateLimiterService,
    RateLimitGuard,
    RateLimitInterceptor,
  ],
  exports: [
    // The guard needs it wherever @UseGuards(RateLimitGuard) instantiates it.
    RESOLVED_RATE_LIMIT_OPTIONS,
    RedisService,
    RateLimitStore,
    RateLimitConfigCentre,
    RateLimitRuleRegistry,
    RateLimiterService,
    RateLimitGuard,
    RateLimitInterceptor,
  ],
})
export class RateLimitModule {
  /** Options validated here, at import time: a bad value stops the app naming the field. */
  static forRoot(options: RateLimitModuleOptions & RateLimitModuleExtras = {}): DynamicModule {
    resolveModuleOptions(options);
    return ownModule(RateLimitConfigurableModule.forRoot(options), options.globalGuard ?? true);
  }

  /** Options from a factory (`useFactory` with `inject`), `useClass` or `useExisting`; validated when it resolves. */
  static forRootAsync(options: RateLimitModuleAsyncOptions): DynamicModule {
    return ownModule(RateLimitConfigurableModule.forRootAsync(options), options.globalGuard ?? true);
  }
}

/** The builder's module, as this module (its providers), with the guard for every route when asked. */
function ownModule(built: DynamicModule, globalGuard: boolean): DynamicModule {
  const module = { ...built, module: RateLimitModule };
  if (!globalGuard) return module;
  return {
    ...module,
    providers: [...(module.providers ?? []), { provide: APP_GUARD, useExisting: RateLimitGuard }],
  };
}

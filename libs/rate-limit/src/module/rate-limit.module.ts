import { type DynamicModule, Logger, Module, type Provider } from '@nestjs/common';
import { APP_GUARD, APP_INTERCEPTOR, DiscoveryModule, ModuleRef } from '@nestjs/core';
import { APP_CONFIG_SERVICE, appConfigService } from '../live/app-config.js';
import { NestConfigCentre } from '../live/nest-config-centre.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { RateLimitManagementService } from '../live/rate-limit-management.service.js';
import { RateLimitKeyAudit } from '../ops/rate-limit-key-audit.js';
import { RedisConfigCentre } from '../live/redis-config-centre.js';
import { RateLimitHealthIndicator } from '../ops/rate-limit-health.indicator.js';
import { RATE_LIMIT_METRICS } from '../limiter/decision-observer.js';
import { RateLimitMetrics } from '../ops/rate-limit-metrics.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import type { Registry } from 'prom-client';
import type { ConfigService } from '@nestjs/config';
import { RateLimitGuard } from '../http/rate-limit.guard.js';
import { RateLimitInterceptor } from '../http/rate-limit.interceptor.js';
import { interceptorProvider } from '../http/interceptor-placement.js';
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
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { BlockCacheStore, BlockedKeys } from '../resilience/block-cache.store.js';
import { DecidingStore } from '../resilience/deciding-store.js';
import { ResilientStore } from '../resilience/resilient-store.js';
import { DeclaredRulesCheck } from '../rules/declared-rules-check.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import {
  DEFAULT_RULES,
  type DefaultRule,
  defaultsNeedInterceptor,
  validateDefaultRules,
} from '../rules/default-rules.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { resolveModuleOptions } from './resolve-options.js';
import { lostWriteCheckSwitchProvider, redisConnectionProvider, storeProvider } from './store-providers.js';
import { LOG_SAMPLING } from './defaults.js';
import { limiterStepsProvider } from './limiter-steps.js';

const resolvedOptionsProvider: Provider = {
  provide: RESOLVED_RATE_LIMIT_OPTIONS,
  inject: [RATE_LIMIT_OPTIONS],
  // What `forRoot` was given was checked when it was called; here it is what a factory returned.
  useFactory: (options: RateLimitModuleOptions) => resolveModuleOptions(options, true),
};

/** The app's `ConfigService`, when `@nestjs/config` is installed and this module sees one. */
const appConfigProvider: Provider = {
  provide: APP_CONFIG_SERVICE,
  inject: [ModuleRef],
  useFactory: appConfigService,
};

const problemLogProvider: Provider = {
  provide: StoreProblemLog,
  useFactory: () => new StoreProblemLog(LOG_SAMPLING.intervalMs),
};

/**
 * The store as the limiter uses it, from the layers the options ask for (`resilience/`): the
 * `storeErrors` policies and the local fallback around the store; and the block cache on them,
 * for a shared store that tells every instance of lowered counts.
 */
const decidingStoreProvider: Provider = {
  provide: DecidingStore,
  inject: [RateLimitStore, StoreProblemLog, RESOLVED_RATE_LIMIT_OPTIONS, RATE_LIMIT_METRICS, RedisService],
  useFactory: (
    store: RateLimitStore,
    problems: StoreProblemLog,
    { storeErrors, memoryStore, blockCache, clock }: ResolvedRateLimitOptions,
    metrics: RateLimitMetrics | null,
    redis: RedisService,
  ): DecidingStore => {
    const observer = metrics ?? undefined;
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
  },
};

/** Prometheus metrics when `metrics` asks for them; `prom-client` is loaded only then. */
const metricsProvider: Provider = {
  provide: RATE_LIMIT_METRICS,
  inject: [RESOLVED_RATE_LIMIT_OPTIONS, RedisService, RateLimitConfigCentre, RateLimitKeyAudit, RateLimitRuleRegistry],
  useFactory: async (
    { metrics }: ResolvedRateLimitOptions,
    redis: RedisService,
    centre: RateLimitConfigCentre,
    audit: RateLimitKeyAudit,
    rules: RateLimitRuleRegistry,
  ): Promise<RateLimitMetrics | null> => {
    if (!metrics) return null;
    let client: typeof import('prom-client');
    try {
      client = await import('prom-client');
    } catch {
      throw new RateLimitConfigurationError(
        "RateLimitModule options: 'metrics' needs the package prom-client: npm install prom-client",
      );
    }
    const registry = (metrics.registry as Registry | undefined) ?? client.register;
    return new RateLimitMetrics(client, registry, metrics.prefix, {
      circuitState: () => (redis.isConfigured ? redis.runner.circuitState : undefined),
      liveConfig: () => (centre instanceof RedisConfigCentre ? centre.state : undefined),
      keysWithoutTtl: () => audit.keysWithoutTtl,
      ruleNames: () => rules.all().map((rule) => rule.name),
      nearLimitRuleNames: () => rules.all().flatMap((rule) => (rule.nearLimit === undefined ? [] : [rule.name])),
    });
  },
};

/**
 * The config centre: one given, one created from a class given (`ModuleRef.create`), or the
 * default. Nest calls the lifecycle hooks of whatever a provider's factory returns, once, as it
 * does a class provider's: a centre that subscribes or polls starts and stops with the app, and
 * nothing here may call its hooks again (called twice, a centre started a second timer that ran
 * on past `app.close()`). An instance that is also another module's provider has its hooks called
 * there as well: give such a centre as a class, or build it in `forRootAsync`'s factory.
 */
const configCentreProvider: Provider = {
  provide: RateLimitConfigCentre,
  // RedisService too, though only a created centre uses it: so Nest starts the connection before
  // the centre (lifecycle hooks run in the order of dependencies), and stops it after.
  inject: [RATE_LIMIT_OPTIONS, ModuleRef, RedisService, APP_CONFIG_SERVICE],
  useFactory: async (
    options: RateLimitModuleOptions,
    moduleRef: ModuleRef,
    _redis: RedisService,
    config: ConfigService | null,
  ): Promise<RateLimitConfigCentre> => {
    const { configCentre } = options;
    if (configCentre instanceof RateLimitConfigCentre) return configCentre;
    if (typeof configCentre === 'function') return moduleRef.create(configCentre);
    if (!config) {
      new Logger('RateLimit').log(
        'ConfigModule is not imported (or @nestjs/config not installed): thresholds are read from process.env only',
      );
    }
    return new NestConfigCentre(config);
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
    redisConnectionProvider,
    appConfigProvider,
    RedisService,
    problemLogProvider,
    storeProvider,
    lostWriteCheckSwitchProvider,
    decidingStoreProvider,
    limiterStepsProvider,
    configCentreProvider,
    RateLimitKeyAudit,
    metricsProvider,
    RateLimitHealthIndicator,
    RateLimitRuleRegistry,
    // Every @RateLimit of the app checked at bootstrap, and compiled into the registry.
    DeclaredRulesCheck,
    RateLimiterService,
    RateLimitManagementService,
    RateLimitGuard,
    interceptorProvider,
  ],
  exports: [
    // The guard needs it wherever @UseGuards(RateLimitGuard) instantiates it.
    RESOLVED_RATE_LIMIT_OPTIONS,
    // For the live centres (their optional ConfigService) where a module that imports this one creates them.
    APP_CONFIG_SERVICE,
    RedisService,
    RateLimitStore,
    RateLimitConfigCentre,
    RateLimitRuleRegistry,
    RateLimiterService,
    RateLimitManagementService,
    RateLimitHealthIndicator,
    RateLimitKeyAudit,
    RateLimitGuard,
    RateLimitInterceptor,
  ],
})
export class RateLimitModule {
  /** Options validated here, at import time: a bad value stops the app naming the field. */
  static forRoot(options: RateLimitModuleOptions & RateLimitModuleExtras = {}): DynamicModule {
    resolveModuleOptions(options);
    const defaults = validateDefaultRules(options.defaults);
    return ownModule(RateLimitConfigurableModule.forRoot(options), options.globalGuard ?? true, defaults);
  }

  /**
   * Options from a factory (`useFactory` with `inject`), `useClass` or `useExisting`; validated when
   * it resolves. `defaults`, `isGlobal` and `globalGuard` are given here, beside the factory.
   */
  static forRootAsync(options: RateLimitModuleAsyncOptions): DynamicModule {
    const defaults = validateDefaultRules(options.defaults);
    return ownModule(RateLimitConfigurableModule.forRootAsync(options), options.globalGuard ?? true, defaults);
  }
}

/**
 * The builder's module, as this module (its providers), with the guard for every route when asked,
 * the `defaults` when given, and the interceptor for every route only when a default needs it (it
 * reads the request after the app's guards, or has `countOn`): other apps' routes never run it.
 */
function ownModule(built: DynamicModule, globalGuard: boolean, defaults: readonly DefaultRule[]): DynamicModule {
  const providers = [...(built.providers ?? [])];
  if (globalGuard) providers.push({ provide: APP_GUARD, useExisting: RateLimitGuard });
  if (defaults.length > 0) {
    providers.push({ provide: DEFAULT_RULES, useValue: defaults });
    if (defaultsNeedInterceptor(defaults))
      providers.push({ provide: APP_INTERCEPTOR, useExisting: RateLimitInterceptor });
  }
  return { ...built, module: RateLimitModule, providers };
}

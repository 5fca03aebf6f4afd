import {
  type DynamicModule,
  type InjectionToken,
  Logger,
  Module,
  type OnModuleInit,
  type Provider,
} from '@nestjs/common';
import {
  APP_GUARD,
  APP_INTERCEPTOR,
  DiscoveryModule,
  DiscoveryService,
  MetadataScanner,
  ModuleRef,
  Reflector,
} from '@nestjs/core';
import { APP_CONFIG_SERVICE, appConfigService } from '../limiter/app-config.js';
import { NestConfigCentre } from '../limiter/nest-config-centre.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import { RateLimitGuard } from '../http/rate-limit.guard.js';
import { RateLimitInterceptor } from '../http/rate-limit.interceptor.js';
import { interceptorProvider } from '../http/interceptor-placement.js';
import { RedisService } from '../redis/redis.service.js';
import { DeclaredRulesCheck } from '../rules/declared-rules-check.js';
import {
  DEFAULT_RULES,
  type DefaultRule,
  defaultsNeedInterceptor,
  validateDefaultRules,
} from '../rules/default-rules.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import type { RateLimitExtension } from './extension.js';
import { RATE_LIMIT_OPTIONS, RateLimitConfigurableModule } from './module-definition.js';
import {
  RESOLVED_RATE_LIMIT_OPTIONS,
  type RateLimitModuleAsyncOptions,
  type RateLimitModuleExtras,
  type RateLimitModuleOptions,
  type ResolvedRateLimitOptions,
} from './options.js';
import { resolveModuleOptions } from './resolve-options.js';
import { limiterProvider } from './limiter-provider.js';
import { redisServiceProvider, storeProvider } from './store-providers.js';

/**
 * The app's `ConfigService`, when `@nestjs/config` is installed and this module sees one, for a
 * config centre made with dependency injection (a class given, `RedisConfigCentre` say, which reads
 * it beneath its own values); registered only where one may be (`ownModule`).
 */
const appConfigProvider: Provider = {
  provide: APP_CONFIG_SERVICE,
  inject: [ModuleRef],
  useFactory: appConfigService,
};

/**
 * The rule registry, which checks every `@RateLimit` of the app and compiles it into itself once
 * the app's modules are initialised (`DeclaredRulesCheck`, which reads providers' instances, made
 * by then): a bad rule stops the app before it serves. Nest runs the hooks of what a factory returns.
 */
const ruleRegistryProvider: Provider = {
  provide: RateLimitRuleRegistry,
  inject: [Reflector, DiscoveryService, MetadataScanner, { token: DEFAULT_RULES, optional: true }],
  useFactory: (
    reflector: Reflector,
    discovery: DiscoveryService,
    scanner: MetadataScanner,
    defaults: readonly DefaultRule[] | undefined,
  ): RateLimitRuleRegistry & OnModuleInit => {
    const registry = new RateLimitRuleRegistry(reflector, defaults ?? null);
    const check = new DeclaredRulesCheck(discovery, scanner, reflector, registry);
    return Object.assign(registry, { onModuleInit: () => check.onModuleInit() });
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
  inject: [RESOLVED_RATE_LIMIT_OPTIONS, ModuleRef, RedisService],
  useFactory: async (
    { configCentre }: ResolvedRateLimitOptions,
    moduleRef: ModuleRef,
  ): Promise<RateLimitConfigCentre> => {
    if (configCentre instanceof RateLimitConfigCentre) return configCentre;
    if (typeof configCentre === 'function') return moduleRef.create(configCentre);
    // The default centre: the app's ConfigService looked up here, as the module sees it.
    const config = await appConfigService(moduleRef);
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
 * Live limits' management, metrics, health and the key audit are `extensions`, each added by the
 * app that wants it from `nest-rate-limit/live` or `nest-rate-limit/ops`.
 */
@Module({
  imports: [DiscoveryModule],
  providers: [
    redisServiceProvider,
    storeProvider,
    configCentreProvider,
    ruleRegistryProvider,
    RateLimitGuard,
    // Placed only on handlers with a rule decided after the app's guards: a default rule's never runs it.
    interceptorProvider,
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
    const resolved = resolveModuleOptions(options);
    return ownModule(RateLimitConfigurableModule.forRoot(options), options, resolved);
  }

  /**
   * Options from a factory (`useFactory` with `inject`), `useClass` or `useExisting`; validated when
   * it resolves. `defaults`, `extensions`, `isGlobal` and `globalGuard` are given here, beside the factory.
   */
  static forRootAsync(options: RateLimitModuleAsyncOptions): DynamicModule {
    return ownModule(RateLimitConfigurableModule.forRootAsync(options), options, undefined);
  }
}

/**
 * The builder's module, as this module (its providers), with the guard for every route when asked,
 * the `defaults` when given, the interceptor for every route only when a default needs it (it
 * reads the request after the app's guards, or has `countOn`): other apps' routes never run it;
 * and the extensions' providers. The options as given are provided resolved, under one token.
 * @param resolved `forRoot`'s options, resolved when it was called; `forRootAsync`'s are resolved
 *   when its factory returns.
 */
function ownModule(
  built: DynamicModule,
  extras: RateLimitModuleExtras,
  resolved: ResolvedRateLimitOptions | undefined,
): DynamicModule {
  const defaults = validateDefaultRules(extras.defaults);
  const extensions = checkExtensions(extras.extensions);
  const providers = (built.providers ?? []).map((provider) => resolvedOptions(provider, resolved));
  const exports: NonNullable<DynamicModule['exports']> = [...(built.exports ?? [])];
  const steps: InjectionToken[] = [];
  for (const extension of extensions) {
    providers.push(...extension.providers);
    exports.push(...(extension.exports ?? []));
    steps.push(...(extension.steps ?? []));
  }
  providers.push(limiterProvider(steps));
  // A centre made with dependency injection may read the app's ConfigService: a class given, or
  // whatever a factory returns (built in it, perhaps, by a module that imports this one).
  if (!resolved || typeof resolved.configCentre === 'function') {
    providers.push(appConfigProvider);
    exports.push(APP_CONFIG_SERVICE);
  }
  if (extras.globalGuard ?? true) providers.push({ provide: APP_GUARD, useExisting: RateLimitGuard });
  if (defaults.length > 0) {
    providers.push({ provide: DEFAULT_RULES, useValue: defaults });
    if (defaultsNeedInterceptor(defaults))
      providers.push({ provide: APP_INTERCEPTOR, useExisting: RateLimitInterceptor });
  }
  return { ...built, module: RateLimitModule, providers, exports };
}

/** The builder's provider of the options as given, as the provider of the options resolved; others as they are. */
function resolvedOptions(provider: Provider, resolved: ResolvedRateLimitOptions | undefined): Provider {
  if (typeof provider !== 'object' || provider.provide !== RATE_LIMIT_OPTIONS) return provider;
  if (resolved) return { provide: RESOLVED_RATE_LIMIT_OPTIONS, useValue: resolved };
  if (!('useFactory' in provider)) throw new Error('RateLimitModule: the options provider has no factory');
  const { useFactory, inject } = provider;
  return {
    provide: RESOLVED_RATE_LIMIT_OPTIONS,
    inject,
    // What `forRoot` was given was checked when it was called; here it is what a factory returned.
    useFactory: async (...args: unknown[]) =>
      resolveModuleOptions((await useFactory(...args)) as RateLimitModuleOptions, true),
  };
}

/** `extensions`, checked: each made by an extension function (`rateLimitMetrics()`, say). */
function checkExtensions(given: unknown): readonly RateLimitExtension[] {
  if (given === undefined) return [];
  const made = (extension: unknown) =>
    typeof extension === 'object' &&
    extension !== null &&
    Array.isArray((extension as Partial<RateLimitExtension>).providers);
  if (!Array.isArray(given) || !given.every(made)) {
    throw new RateLimitConfigurationError(
      "RateLimitModule options: 'extensions' must be a list of what the extension functions return " +
        "(rateLimitManagement() from 'nest-rate-limit/live'; rateLimitMetrics(), rateLimitHealth(), " +
        "rateLimitKeyAudit() from 'nest-rate-limit/ops')",
    );
  }
  return given as readonly RateLimitExtension[];
}

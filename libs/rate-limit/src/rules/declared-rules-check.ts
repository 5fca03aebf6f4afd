import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import { RATE_LIMIT_RULES } from '../decorators/metadata-keys.js';
import { type RateLimitOptions, type RateLimitRule, RateLimitConfigurationError } from './rate-limit-rule.js';
import { RateLimitRuleRegistry } from './rate-limit-rule.registry.js';
import {
  CONTROLLER,
  GATEWAY,
  GATEWAY_METADATA,
  type Handler,
  type HandlerClass,
  type HandlerKind,
  RESOLVER,
  RESOLVER_TYPE_METADATA,
  SUPPORTED_HANDLERS,
  handlerKindOf,
} from './handler-kinds.js';

/**
 * Checks every `@RateLimit` in the app once, at bootstrap, so a bad value stops the app before it
 * serves; the guard then only looks rules up (`RateLimitRuleRegistry`, which every request opens,
 * and which this file stays out of). Every controller, resolver and gateway has its handlers' rules
 * compiled into the registry, and with them its name for the limiter's API outside HTTP. So is every
 * other provider, and every method the guard never limits (a microservice handler, a GraphQL
 * subscription): a rule it would never apply must not leave a handler its author thinks protected.
 * Two rule names of one key id, which would share counters, are refused too.
 */
@Injectable()
export class DeclaredRulesCheck implements OnModuleInit {
  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly registry: RateLimitRuleRegistry,
  ) {}

  /** Per default rule's name: handlers it covers, handlers with a rule of its name instead, handlers that skip it. */
  private readonly coverage = new Map<string, { covered: number; replaced: number; skipped: number }>();

  onModuleInit(): void {
    const problems = new Set<string>();
    const classesByName = new Map<string, Set<Handler>>();
    const controllers = new Set<Handler>();
    for (const { metatype } of this.discovery.getControllers()) {
      if (typeof metatype !== 'function') continue;
      controllers.add(metatype);
      this.checkHandlers(metatype, CONTROLLER, problems, classesByName);
    }
    // A class can be provided by several modules, and a controller listed as a provider too.
    const providers = new Set<Handler>();
    for (const wrapper of this.discovery.getProviders()) {
      const type = providedClass(wrapper);
      if (type && !controllers.has(type)) providers.add(type);
    }
    for (const type of providers) {
      const keys = Reflect.getMetadataKeys(type) as unknown[];
      if (keys.includes(RESOLVER_TYPE_METADATA)) this.checkHandlers(type, RESOLVER, problems, classesByName);
      else if (this.reflector.get(GATEWAY_METADATA, type) === true) {
        this.checkHandlers(type, GATEWAY, problems, classesByName);
      } else this.checkProvider(type, problems);
    }
    this.checkKeyIds(problems);
    if (problems.size > 0) {
      throw new RateLimitConfigurationError([...problems]);
    }
    this.logCoverage();
    for (const [name, classes] of classesByName) {
      if (classes.size > 1) {
        new Logger('RateLimit').warn(
          `${classes.size} classes are named ${name}: rules named after the class share their counters; give them distinct 'name's`,
        );
      }
    }
  }

  private checkHandlers(
    type: Handler,
    kind: HandlerClass,
    problems: Set<string>,
    classesByName: Map<string, Set<Handler>>,
  ): void {
    const prototype = type.prototype as Record<string, Handler>;
    const methods = this.scanner.getAllMethodNames(prototype);
    const hasLimited = methods.some((method) => this.kindOf(prototype[method]) === kind.limited);
    for (const method of methods) {
      const handler = prototype[method];
      const route = `${type.name}.${method}`;
      const handlerKind = this.kindOf(handler);
      // Class rules cover the handlers only; a helper method is not one of them.
      if (handlerKind === 'none' && this.declaresRules(handler)) {
        problems.add(
          `@RateLimit on ${route}: it is not a handler (no ${kind.needs}), so nothing reaches it through the guard; put @RateLimit on the handler instead`,
        );
      }
      let rules: readonly RateLimitRule[];
      try {
        rules = this.registry.rulesFor(type, handler);
      } catch (error) {
        if (!(error instanceof RateLimitConfigurationError)) throw error;
        for (const problem of error.problems) problems.add(problem);
        continue;
      }
      if (handlerKind === kind.limited) this.count(rules);
      if (rules.some((rule) => rule.name.startsWith(`${type.name}.`) || rule.name === type.name)) {
        if (!classesByName.has(type.name)) classesByName.set(type.name, new Set());
        classesByName.get(type.name)!.add(type);
      }
      const what = kind.unsupported[handlerKind];
      if (!what) continue;
      // Rules left after @SkipRateLimit: each one the author expects to hold, and none does.
      const why = `${what}, and ${SUPPORTED_HANDLERS}`;
      if (rules.some((rule) => rule.declaredOn !== type.name)) {
        problems.add(`@RateLimit on ${route}: ${route} is ${why}; remove it`);
      }
      if (rules.some((rule) => rule.declaredOn === type.name)) {
        const fix = hasLimited
          ? `put @SkipRateLimit() on ${route}`
          : `remove @RateLimit from ${type.name}, which has no handler the guard limits`;
        problems.add(`@RateLimit on ${type.name} applies to ${route}, ${why}; ${fix}`);
      }
    }
  }

  /** Counts what each default does on one handler the guard limits. */
  private count(rules: readonly RateLimitRule[]): void {
    for (const { rule: defaultRule } of this.registry.defaults) {
      const { name } = defaultRule;
      let counts = this.coverage.get(name);
      if (!counts) this.coverage.set(name, (counts = { covered: 0, replaced: 0, skipped: 0 }));
      const applied = rules.find((rule) => rule.name === name);
      if (!applied) counts.skipped += 1;
      else if (applied.fromDefaults) counts.covered += 1;
      else counts.replaced += 1;
    }
  }

  /** One line at the start: what the module's `defaults` cover, so a route left open shows. */
  private logCoverage(): void {
    const { defaults } = this.registry;
    if (defaults.length === 0) return;
    const parts = defaults.map(({ rule, scope }) => {
      const { covered = 0, replaced = 0, skipped = 0 } = this.coverage.get(rule.name) ?? {};
      const others = [replaced > 0 ? `${replaced} replace it` : '', skipped > 0 ? `${skipped} skip it` : '']
        .filter(Boolean)
        .join(', ');
      return `'${rule.name}' (${rule.count} per ${rule.windowMs} ms, per ${scope === 'app' ? 'identity across the app' : 'route'}) covers ${covered} of ${covered + replaced + skipped} handlers${others ? ` (${others})` : ''}`;
    });
    new Logger('RateLimit').log(`Default rules: ${parts.join('; ')}`);
  }

  /**
   * Keys name a rule by its `keyId`, a digest for most names: two names of one digest would count
   * on one counter. By chance about once in a billion apps of a thousand rules, but never silent.
   */
  private checkKeyIds(problems: Set<string>): void {
    const byKeyId = new Map<string, RateLimitRule>();
    const names = new Set<string>();
    // The registry's rules, by name in the order first declared: the first of each name.
    for (const rule of this.registry.all()) {
      if (names.has(rule.name)) continue;
      names.add(rule.name);
      const other = byKeyId.get(rule.keyId);
      if (!other) byKeyId.set(rule.keyId, rule);
      else {
        problems.add(
          `@RateLimit on ${other.declaredOn} and on ${rule.declaredOn}: the rules named ${JSON.stringify(other.name)} and ${JSON.stringify(rule.name)} ` +
            `have the same key id ${rule.keyId}, so they would share counters; rename one (give it a 'name')`,
        );
      }
    }
  }

  /** The guard never limits the methods of other providers (services, repositories), so no rule on one applies. */
  private checkProvider(type: Handler, problems: Set<string>): void {
    const why = `${type.name} is a provider, not a controller, resolver or gateway, and ${SUPPORTED_HANDLERS}; remove it, or put it on the handler that leads here`;
    if (this.declaresRules(type)) problems.add(`@RateLimit on ${type.name}: ${why}`);
    const prototype = type.prototype as Record<string, Handler> | undefined;
    if (!prototype) return;
    for (const method of this.scanner.getAllMethodNames(prototype)) {
      if (this.declaresRules(prototype[method])) problems.add(`@RateLimit on ${type.name}.${method}: ${why}`);
    }
  }

  private declaresRules(target: Handler): boolean {
    return (this.reflector.get<RateLimitOptions[] | undefined>(RATE_LIMIT_RULES, target)?.length ?? 0) > 0;
  }

  private kindOf(handler: Handler): HandlerKind {
    return handlerKindOf(this.reflector, handler);
  }
}

/**
 * The class whose decorators a provider carries: its own for a class provider; for a factory or a
 * value, the class of what it produced (instances exist by onModuleInit, except request-scoped ones).
 */
function providedClass({ metatype, instance, isNotMetatype }: InstanceWrapper): Handler | undefined {
  if (!isNotMetatype) return typeof metatype === 'function' ? metatype : undefined;
  if (typeof instance !== 'object' || instance === null) return undefined;
  const prototype = Object.getPrototypeOf(instance) as { constructor: Handler } | null;
  // A plain object or an Object.create(null) value is no class's instance: it has no decorators.
  if (prototype === null || prototype === Object.prototype) return undefined;
  return typeof prototype.constructor === 'function' ? prototype.constructor : undefined;
}

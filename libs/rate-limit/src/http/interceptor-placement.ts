import { INTERCEPTORS_METADATA } from '@nestjs/common/constants.js';
import type { Provider } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, ModuleRef } from '@nestjs/core';
import { RATE_LIMIT_RULES } from '../decorators/metadata-keys.js';
import type { Handler } from '../rules/handler-kinds.js';
import { defaultsNeedInterceptor } from '../rules/default-rules.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitInterceptor } from './rate-limit.interceptor.js';

/**
 * Puts the module's `RateLimitInterceptor` on each handler with a rule decided after the app's
 * guards (`RateLimitRule.afterGuards`, known once its rules are compiled), first of the handler's
 * own interceptors; every other route never runs it, and pays nothing for Nest's interceptor
 * pipeline. `@RateLimit` itself only writes metadata.
 *
 * Runs while the module's providers are made, before Nest builds its routes, resolvers and
 * gateways, which read a handler's interceptors then. The instance is put there, not its class:
 * Nest makes a class only where its scan found it, and the scan is over. A handler whose rules do
 * not compile is left as it is; `DeclaredRulesCheck` stops the app with its problems right after.
 */
export function placeInterceptor(
  interceptor: RateLimitInterceptor,
  discovery: DiscoveryService,
  scanner: MetadataScanner,
  registry: RateLimitRuleRegistry,
): void {
  const classes = new Set<Handler>();
  for (const wrapper of [...discovery.getControllers(), ...discovery.getProviders()]) {
    const type: unknown = wrapper.metatype;
    if (typeof type === 'function' && type.prototype) classes.add(type);
  }
  for (const type of classes) {
    const prototype = type.prototype as Record<string, Handler>;
    const methods = scanner.getAllMethodNames(prototype);
    const declares = (target: object) => Reflect.getOwnMetadata(RATE_LIMIT_RULES, target) !== undefined;
    if (!declares(type) && !methods.some((method) => declares(prototype[method]))) continue;
    for (const method of methods) {
      const handler = prototype[method];
      if (decidedAfterGuards(registry, type, handler)) addFirst(interceptor, type, handler);
    }
  }
}

function decidedAfterGuards(registry: RateLimitRuleRegistry, type: Handler, handler: Handler): boolean {
  try {
    return registry.rulesFor(type, handler).some((rule) => rule.afterGuards.elsewhere);
  } catch {
    return false; // reported by DeclaredRulesCheck
  }
}

/** Once per handler: not again where the app put the interceptor itself, on the handler or its class. */
function addFirst(interceptor: RateLimitInterceptor, type: Handler, handler: Handler): void {
  const own: unknown[] = Reflect.getOwnMetadata(INTERCEPTORS_METADATA, handler) ?? [];
  const onClass: unknown[] = Reflect.getOwnMetadata(INTERCEPTORS_METADATA, type) ?? [];
  const placed = (entry: unknown) => entry === interceptor || entry === interceptor.constructor;
  if (own.some(placed) || onClass.some(placed)) return;
  Reflect.defineMetadata(INTERCEPTORS_METADATA, [interceptor, ...own], handler);
}

/**
 * The interceptor, put on the handlers whose rules are decided after the app's guards; when a
 * `defaults` rule is, it runs for every route instead (`ownModule`), and is put nowhere.
 */
export const interceptorProvider: Provider = {
  provide: RateLimitInterceptor,
  inject: [ModuleRef, DiscoveryService, MetadataScanner, RateLimitRuleRegistry],
  useFactory: (
    moduleRef: ModuleRef,
    discovery: DiscoveryService,
    scanner: MetadataScanner,
    registry: RateLimitRuleRegistry,
  ) => {
    const interceptor = new RateLimitInterceptor(moduleRef);
    if (!defaultsNeedInterceptor(registry.defaults)) placeInterceptor(interceptor, discovery, scanner, registry);
    return interceptor;
  },
};

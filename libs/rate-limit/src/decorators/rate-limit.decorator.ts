import type { RateLimitOptions } from '../rules/rate-limit-rule.js';
import { RATE_LIMIT_RULES, RATE_LIMIT_SKIP } from './metadata-keys.js';

/**
 * Limits a handler, or every handler of a controller.
 *
 * Rules stack: a class rule applies to each handler and a handler rule adds to it, unless both have
 * the same `name`, in which case the handler's rule replaces the class's for that handler.
 * Values are checked at bootstrap; a bad one stops the app with an error naming the route and field.
 *
 * A rule that reads the request through a function (`by`, `tiers.of` or `skipIf`) is decided after the
 * app's guards (an authentication guard has set `req.user` by then), by `RateLimitInterceptor`,
 * which the module puts on such handlers at bootstrap; so is a rule with `settleCost`, and on a
 * GraphQL operation or a WebSocket message a rule with `countOn`. Every other rule is decided by
 * `RateLimitGuard`, before the app's own guards. The decorator itself only writes metadata.
 *
 * @example
 * ```ts
 * @RateLimit({ count: 5, window: '10s' })            // per client IP
 * @RateLimit(100, '1m', 'orders.list')               // positional; threshold from the config centre
 * @RateLimit({ count: 3, window: '10s', by: (ctx) => ctx.switchToHttp().getRequest().user.id })
 * ```
 */
export function RateLimit(options: RateLimitOptions): ClassDecorator & MethodDecorator;
export function RateLimit(
  count: number,
  window: RateLimitOptions['window'],
  configKey?: string,
): ClassDecorator & MethodDecorator;
export function RateLimit(
  optionsOrCount: RateLimitOptions | number,
  window?: RateLimitOptions['window'],
  configKey?: string,
): ClassDecorator & MethodDecorator {
  const options: RateLimitOptions =
    typeof optionsOrCount === 'object' && optionsOrCount !== null
      ? { ...optionsOrCount }
      : { count: optionsOrCount, window: window as RateLimitOptions['window'], configKey };
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    const holder = descriptor ? (descriptor.value as object) : target;
    const existing: RateLimitOptions[] = Reflect.getOwnMetadata(RATE_LIMIT_RULES, holder) ?? [];
    // Decorators apply bottom-up; keep the order in which they are written.
    Reflect.defineMetadata(RATE_LIMIT_RULES, [options, ...existing], holder);
  };
}

/**
 * Exempts a handler (or a controller) from rate limiting: from every rule, or from the named ones.
 *
 * @example
 * ```ts
 * @SkipRateLimit()          // no rule applies
 * @SkipRateLimit('orders')  // the class rule named 'orders' does not apply here
 * ```
 */
export function SkipRateLimit(...ruleNames: string[]): ClassDecorator & MethodDecorator {
  const skip: true | string[] = ruleNames.length === 0 ? true : ruleNames;
  return (target: object, _key?: string | symbol, descriptor?: PropertyDescriptor) => {
    Reflect.defineMetadata(RATE_LIMIT_SKIP, skip, descriptor ? (descriptor.value as object) : target);
  };
}

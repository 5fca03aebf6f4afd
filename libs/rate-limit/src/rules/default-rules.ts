import { type RateLimitRule, RateLimitConfigurationError, validateRule } from './rate-limit-rule.js';
import { ruleKeyId } from '../store/key-layout.js';
import type { RateLimitModuleExtras } from '../module/options.js';

/** A rule of the module's `defaults`: a rule's options, and what its counter covers. */
type DefaultRuleOptions = NonNullable<RateLimitModuleExtras['defaults']>[number];

/** A default rule after validation at bootstrap. */
export interface DefaultRule {
  readonly rule: RateLimitRule;
  readonly scope: 'route' | 'app';
}

/** Injection token of the module's validated `defaults` (internal). */
export const DEFAULT_RULES = Symbol('RATE_LIMIT_DEFAULT_RULES');

/**
 * The module's `defaults`, checked as decorators are, each named in messages as
 * `RateLimitModule defaults[i]`. One rule may go without a name (it is `'default'`, as throttler
 * names its own); several need one each, which is how `@SkipRateLimit('name')` and a decorator rule
 * of that name replace them on a route.
 */
export function validateDefaultRules(defaults: unknown): DefaultRule[] {
  if (defaults === undefined) return [];
  if (!Array.isArray(defaults)) {
    throw new RateLimitConfigurationError(
      `RateLimitModule options: 'defaults' must be an array of rules ({ count, window, ... }), got ${typeof defaults}`,
    );
  }
  const problems: string[] = [];
  const rules: DefaultRule[] = [];
  for (const [i, given] of (defaults as unknown[]).entries()) {
    const subject = `RateLimitModule defaults[${i}]`;
    if (given === null || typeof given !== 'object') {
      problems.push(`${subject}: must be a rule's options ({ count, window, ... })`);
      continue;
    }
    const { scope = 'route', ...options } = given as DefaultRuleOptions;
    if (scope !== 'route' && scope !== 'app') {
      problems.push(`${subject}: 'scope' must be 'route' or 'app', got ${JSON.stringify(scope)}`);
      continue;
    }
    if (options.name === undefined && defaults.length > 1) {
      problems.push(
        `${subject}: 'name' is needed when there are several defaults (one each, to skip or replace it by)`,
      );
      continue;
    }
    try {
      const rule = validateRule(options, subject, 'default', subject);
      if (rules.some((other) => other.rule.name === rule.name)) {
        problems.push(
          `${subject}: 'name' ${JSON.stringify(rule.name)} is used by two defaults; give each a distinct name`,
        );
      }
      rules.push({ rule: { ...rule, fromDefaults: true }, scope });
    } catch (error) {
      if (!(error instanceof RateLimitConfigurationError)) throw error;
      problems.push(...error.problems);
    }
  }
  if (problems.length > 0) throw new RateLimitConfigurationError(problems);
  return rules;
}

/**
 * A default as it applies to one handler: the rule itself for `scope: 'app'`; for `'route'`, the rule
 * with a counter of the route's own (its key id made of the route and the name, which no declared
 * rule's name can produce: `#` is not allowed in names).
 */
export function defaultRuleFor(rule: DefaultRule, route: string): RateLimitRule {
  return rule.scope === 'app' ? rule.rule : perRoute(rule.rule, route);
}

function perRoute(rule: RateLimitRule, route: string): RateLimitRule {
  return { ...countedPerRoute(rule, route), declaredOn: `${rule.declaredOn} on ${route}` };
}

/** What the limiter's API calls one route's counter of a rule counted per route: `Shop.list#default`. */
export function perRouteName(route: string, name: string): string {
  return `${route}#${name}`;
}

/**
 * A rule counted on a counter of the route's own. A decorator rule that replaces a `'route'` default
 * counts so too: it changes the route's thresholds, as `@Throttle` on a route does in throttler,
 * and two routes replacing it never share a counter by the name they both give.
 */
export function countedPerRoute(rule: RateLimitRule, route: string): RateLimitRule {
  const keyId = ruleKeyId(perRouteName(route, rule.name));
  const tiers = rule.tiers && new Map([...rule.tiers].map(([tier, variant]) => [tier, { ...variant, keyId }]));
  return { ...rule, keyId, tiers };
}

/**
 * Whether a default needs `RateLimitInterceptor` on every route: it reads the request after the
 * app's guards, has `countOn` (settled by a GraphQL or WebSocket handler's outcome) or
 * `settleCost` (settled by any handler's result).
 */
export function defaultsNeedInterceptor(rules: readonly DefaultRule[]): boolean {
  return rules.some(({ rule }) => rule.afterGuards.elsewhere);
}

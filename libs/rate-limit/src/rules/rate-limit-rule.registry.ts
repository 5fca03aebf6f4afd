import { Inject, Injectable, Optional } from '@nestjs/common';
import { SSE_METADATA } from '@nestjs/common/constants.js';
import { Reflector } from '@nestjs/core';
import { RATE_LIMIT_RULES, RATE_LIMIT_SKIP } from '../decorators/metadata-keys.js';
import {
  type RateLimitOptions,
  type RateLimitRule,
  RateLimitConfigurationError,
  validateRule,
} from './rate-limit-rule.js';
import { DEFAULT_RULES, type DefaultRule, countedPerRoute, defaultRuleFor, perRouteName } from './default-rules.js';
import { type Handler, LIMITED_KINDS, handlerKindOf } from './handler-kinds.js';
import { ruleKeyId } from '../store/key-layout.js';

const NO_RULES: readonly RateLimitRule[] = Object.freeze([]);

/**
 * A rule for `consume` and `reset`: the name of a rule declared with `@RateLimit`, or a rule's
 * options with a `name` (its counters are those of any route's rule of that name).
 */
export type RateLimitRuleRef = string | (RateLimitOptions & { name: string });

/**
 * Turns decorator metadata into validated rules once per handler, and answers what a request asks:
 * the rules of its handler (`rulesFor`) and which of them wait for the app's guards; the guard asks
 * once per handler and keeps the answer. It holds only that and the compiling it needs; what
 * bootstrap checks once (every controller, resolver, gateway and provider of the app, the key ids)
 * is `DeclaredRulesCheck`'s, which fills this registry before the app serves. Rules by name, for
 * the limiter's API outside HTTP and for live limits, are here too.
 */
@Injectable()
export class RateLimitRuleRegistry {
  private readonly rulesByClass = new WeakMap<Handler, Map<Handler, readonly RateLimitRule[]>>();
  /** A handler's rules split around the app's guards on HTTP, where some wait for them (`splitAroundGuards`). */
  private readonly splitOnHttp = new WeakMap<readonly RateLimitRule[], GuardSplit>();
  /** The same on GraphQL and WebSocket, where a `countOn` rule waits for them too. */
  private readonly splitOnOthers = new WeakMap<readonly RateLimitRule[], GuardSplit>();
  /** Every rule declared on a handler, by name, for the limiter's API outside HTTP. */
  private readonly rulesByName = new Map<string, RateLimitRule[]>();
  /** Rules counted per route, each with the name of its route's counter (`perRouteName`). */
  private readonly perRoute = new Map<RateLimitRule, string>();
  /** The `@Sse()` routes among the handlers compiled. */
  private readonly eventStreams = new WeakSet<Handler>();
  /** Rules given to the limiter's API as options, validated once per object. */
  private readonly givenRules = new WeakMap<object, RateLimitRule>();

  /** The module's `defaults`: rules of every handler the guard limits, unless it says otherwise. */
  readonly defaults: readonly DefaultRule[];

  constructor(
    private readonly reflector: Reflector,
    @Optional() @Inject(DEFAULT_RULES) defaults: readonly DefaultRule[] | null = null,
  ) {
    this.defaults = defaults ?? [];
  }

  /** The rules that apply to one handler of one controller, in declaration order. */
  rulesFor(controller: Handler, handler: Handler): readonly RateLimitRule[] {
    let byHandler = this.rulesByClass.get(controller);
    if (!byHandler) this.rulesByClass.set(controller, (byHandler = new Map()));
    let rules = byHandler.get(handler);
    if (!rules) byHandler.set(handler, (rules = this.compile(controller, handler)));
    return rules;
  }

  /** Whether a handler (one `rulesFor` compiled) is an `@Sse()` route: its stream ends when its client leaves. */
  isEventStream(handler: Handler): boolean {
    return this.eventStreams.has(handler);
  }

  /**
   * A handler's rules (as `rulesFor` gave them) split into those `RateLimitGuard` decides before the
   * app's guards and those `RateLimitInterceptor` decides after them (each rule's `afterGuards`);
   * undefined when every rule is decided before (which rules wait: `afterGuardsOf` in
   * rate-limit-rule.ts; a default rule does not). Each part is still one store call.
   * @param http whether the request is an HTTP one (else a GraphQL operation or a WebSocket message)
   */
  splitAroundGuards(rules: readonly RateLimitRule[], http: boolean): GuardSplit | undefined {
    return (http ? this.splitOnHttp : this.splitOnOthers).get(rules);
  }

  /**
   * The rule declared with `@RateLimit` under this name. Rules on several routes may share a name
   * (and so their counters); they must then agree on how they count.
   */
  named(name: string): RateLimitRule {
    const rules = this.everyNamed(name);
    if (rules.length > 1 && rules.every((rule) => this.perRoute.has(rule))) {
      throw new RateLimitConfigurationError(
        `The rule named ${JSON.stringify(name)} counts per route: name one route's counter, as ${JSON.stringify(this.perRoute.get(rules[0]))}`,
      );
    }
    if (rules.length > 1) {
      throw new RateLimitConfigurationError(
        `The rules named ${JSON.stringify(name)} on ${rules.map((rule) => rule.declaredOn).join(', ')} count differently; pass the rule's options instead`,
      );
    }
    return rules[0];
  }

  /** Every rule of this name (one per way of counting; a rule counted per route, one per route). */
  private everyNamed(name: string): readonly RateLimitRule[] {
    const rules = this.rulesByName.get(name);
    if (!rules) {
      const known = [...this.rulesByName.keys()].filter((known) => !known.includes('#'));
      throw new RateLimitConfigurationError(
        `No @RateLimit rule is named ${JSON.stringify(name)} (rules: ${JSON.stringify(known)}); pass the rule's options instead`,
      );
    }
    return rules;
  }

  /**
   * Every rule declared on a route (or applied from the defaults), one per name and way of
   * counting; with each tier of a rule that has `tiers` (of the same name, its own `configKey`).
   */
  all(): RateLimitRule[] {
    // A rule counted per route is held under its route's name too: listed once.
    return [...new Set([...this.rulesByName.values()].flat())].flatMap((rule) =>
      rule.tiers ? [rule, ...rule.tiers.values()] : [rule],
    );
  }

  /** The rules declared on routes that read their thresholds from this `configKey`. */
  withConfigKey(configKey: string): RateLimitRule[] {
    return this.all().filter((rule) => rule.configKey === configKey);
  }

  /**
   * The rules a caller of the limiter's API names (`RateLimiterService.consume`, `reset`,
   * `inspect`): declared ones by name; given ones validated once per object.
   */
  resolve(rules: RateLimitRuleRef | readonly RateLimitRuleRef[], method: string): RateLimitRule[] {
    if (!Array.isArray(rules)) return [this.ruleOf(rules as RateLimitRuleRef, method)];
    const list = rules as readonly RateLimitRuleRef[];
    if (list.length === 0) throw new RateLimitConfigurationError(`RateLimiterService.${method}: no rule given`);
    return list.map((ref) => this.ruleOf(ref, method));
  }

  /**
   * For work outside HTTP (`consume`): as `resolve`, refusing a rule that takes its `settleCost.max`
   * from the request, which such work has none of.
   */
  resolveOutsideHttp(rules: RateLimitRuleRef | readonly RateLimitRuleRef[], method: string): RateLimitRule[] {
    const resolved = this.resolve(rules, method);
    const fromRequest = resolved.find((rule) => typeof rule.maxCost === 'function');
    if (fromRequest) {
      throw new RateLimitConfigurationError(
        `RateLimiterService.${method}: rule ${fromRequest.name} takes its 'settleCost.max' from the request (a function), which work outside HTTP has none of; declare it as a number`,
      );
    }
    return resolved;
  }

  /**
   * For `reset`: as `resolve`, but a name stands for every rule of it, so an identity is forgotten
   * on every route of a rule counted per route (and under each way rules of one name count).
   */
  resolveEvery(rules: RateLimitRuleRef | readonly RateLimitRuleRef[], method: string): RateLimitRule[] {
    const list = (Array.isArray(rules) ? rules : [rules]) as readonly RateLimitRuleRef[];
    if (list.length === 0) throw new RateLimitConfigurationError(`RateLimiterService.${method}: no rule given`);
    return list.flatMap((ref) => (typeof ref === 'string' ? this.everyNamed(ref) : [this.ruleOf(ref, method)]));
  }

  private ruleOf(ref: RateLimitRuleRef, method: string): RateLimitRule {
    if (typeof ref === 'string') return this.named(ref);
    let rule = this.givenRules.get(ref);
    if (!rule) {
      const subject = `RateLimiterService.${method}: rule ${JSON.stringify(ref?.name)}`;
      // Without `by`, the identity counts as the caller gives it (not as a client address).
      const options = typeof ref === 'object' && ref !== null ? { by: identityAsGiven, ...ref } : ref;
      rule = validateRule(options, `RateLimiterService.${method}`, undefined, subject);
      this.givenRules.set(ref, rule);
    }
    return rule;
  }

  private compile(controller: Handler, handler: Handler): readonly RateLimitRule[] {
    if (Reflect.getMetadata(SSE_METADATA, handler) === true) this.eventStreams.add(handler);
    const className = controller.name;
    const route = `${className}.${handler.name}`;
    const problems: string[] = [];
    const classRules = this.declaredOn(controller, className, className, problems);
    const handlerRules = this.declaredOn(handler, route, route, problems);
    if (problems.length > 0) throw new RateLimitConfigurationError(problems);
    const replaced = new Set(handlerRules.map((rule) => rule.name));
    let declared = [...classRules.filter((rule) => !replaced.has(rule.name)), ...handlerRules];
    for (const rule of declared) replaced.add(rule.name);
    if (this.defaults.some(({ scope }) => scope === 'route')) {
      const perRoute = new Set(this.defaults.flatMap(({ rule, scope }) => (scope === 'route' ? [rule.name] : [])));
      declared = declared.map((rule) => (perRoute.has(rule.name) ? countedPerRoute(rule, route) : rule));
    }
    // Defaults cover what the guard limits (routes, GraphQL operations, gateway messages), nothing
    // else it may see (a microservice handler in a hybrid app); a declared rule of a default's name
    // replaces it.
    const defaults =
      this.defaults.length > 0 && LIMITED_KINDS.includes(handlerKindOf(this.reflector, handler))
        ? this.defaults.filter(({ rule }) => !replaced.has(rule.name)).map((rule) => defaultRuleFor(rule, route))
        : NO_RULES;
    const rules = [...defaults, ...declared];
    for (const rule of rules) {
      this.addNamed(rule.name, rule);
      if (rule.keyId === ruleKeyId(perRouteName(route, rule.name))) {
        // One route's counter of a rule counted per route, by a name of its own.
        this.perRoute.set(rule, perRouteName(route, rule.name));
        this.addNamed(perRouteName(route, rule.name), rule);
      }
    }

    const skip = this.reflector.getAllAndOverride<true | string[] | undefined>(RATE_LIMIT_SKIP, [handler, controller]);
    if (skip === true) return NO_RULES;
    if (skip) {
      const unknown = skip.filter((name) => !rules.some((rule) => rule.name === name));
      if (unknown.length > 0) {
        throw new RateLimitConfigurationError(
          `@SkipRateLimit on ${route}: 'ruleNames' ${JSON.stringify(unknown)} match no rule here (rules: ${JSON.stringify(rules.map((r) => r.name))})`,
        );
      }
      return this.applied(rules.filter((rule) => !skip.includes(rule.name)));
    }
    return this.applied(rules);
  }

  private addNamed(name: string, rule: RateLimitRule): void {
    const named = this.rulesByName.get(name) ?? [];
    if (!named.some((other) => sameCounter(other, rule))) named.push(rule);
    this.rulesByName.set(name, named);
  }

  private applied(rules: RateLimitRule[]): readonly RateLimitRule[] {
    if (rules.length === 0) return NO_RULES;
    const frozen = Object.freeze(rules);
    const onHttp = splitAroundGuards(frozen, (rule) => rule.afterGuards.http);
    if (onHttp) this.splitOnHttp.set(frozen, onHttp);
    const onOthers = splitAroundGuards(frozen, (rule) => rule.afterGuards.elsewhere);
    if (onOthers) this.splitOnOthers.set(frozen, onOthers);
    return frozen;
  }

  /** Validated rules declared on a class or handler; problems are collected, not thrown, so all are reported. */
  private declaredOn(target: Handler, declaredOn: string, defaultName: string, problems: string[]): RateLimitRule[] {
    const declared = this.reflector.get<RateLimitOptions[] | undefined>(RATE_LIMIT_RULES, target) ?? [];
    const rules: RateLimitRule[] = [];
    for (const options of declared) {
      try {
        const rule = validateRule(options, declaredOn, defaultName);
        if (rules.some((other) => other.name === rule.name)) {
          problems.push(
            `@RateLimit on ${declaredOn}: 'name' ${JSON.stringify(rule.name)} is used by two rules; give each rule a distinct name`,
          );
        }
        rules.push(rule);
      } catch (error) {
        if (!(error instanceof RateLimitConfigurationError)) throw error;
        problems.push(...error.problems);
      }
    }
    return rules;
  }
}

/** A handler's rules on either side of the app's guards: each part decided in one store call. */
export interface GuardSplit {
  /** Decided by `RateLimitGuard`, before the app's guards; may be empty. */
  readonly beforeGuards: readonly RateLimitRule[];
  /** Decided by `RateLimitInterceptor`, after them; never empty. */
  readonly afterGuards: readonly RateLimitRule[];
}

function splitAroundGuards(
  rules: readonly RateLimitRule[],
  waitsForGuards: (rule: RateLimitRule) => boolean,
): GuardSplit | undefined {
  const afterGuards = rules.filter(waitsForGuards);
  if (afterGuards.length === 0) return undefined;
  const beforeGuards = rules.filter((rule) => !waitsForGuards(rule));
  return { beforeGuards: Object.freeze(beforeGuards), afterGuards: Object.freeze(afterGuards) };
}

/** Whether two rules of one name count alike: the same thresholds, algorithm and penalty. */
function sameCounter(a: RateLimitRule, b: RateLimitRule): boolean {
  return (
    a.keyId === b.keyId &&
    a.count === b.count &&
    a.windowMs === b.windowMs &&
    a.configKey === b.configKey &&
    a.algorithm === b.algorithm &&
    a.burst === b.burst &&
    a.blockMs === b.blockMs &&
    a.mode === b.mode
  );
}

/** The `by` of a rule given as options without one: only ever asked outside HTTP, where the caller names the identity. */
function identityAsGiven(): string {
  throw new Error('A rule given to RateLimiterService has no HTTP identity');
}

import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { RATE_LIMIT_RULES, RATE_LIMIT_SKIP } from '../rate-limit.constants.js';
import {
  type RateLimitOptions,
  type RateLimitRule,
  RateLimitConfigurationError,
  validateRule,
} from './rate-limit-rule.js';

// eslint-disable-next-line @typescript-eslint/no-unsafe-function-type -- what ExecutionContext.getHandler() returns
type Handler = Function;
const NO_RULES: readonly RateLimitRule[] = Object.freeze([]);

/**
 * Turns decorator metadata into validated rules once per handler. Every controller is checked at
 * bootstrap, so a bad value stops the app before it serves; the guard then only looks rules up.
 */
@Injectable()
export class RateLimitRuleRegistry implements OnModuleInit {
  private readonly rulesByClass = new WeakMap<Handler, Map<Handler, readonly RateLimitRule[]>>();

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
  ) {}

  onModuleInit(): void {
    const problems = new Set<string>();
    const classesByName = new Map<string, Set<Handler>>();
    for (const { metatype } of this.discovery.getControllers()) {
      if (typeof metatype !== 'function') continue;
      const prototype = metatype.prototype as Record<string, Handler>;
      for (const method of this.scanner.getAllMethodNames(prototype)) {
        try {
          const rules = this.rulesFor(metatype, prototype[method]);
          if (rules.some((rule) => rule.name.startsWith(`${metatype.name}.`) || rule.name === metatype.name)) {
            if (!classesByName.has(metatype.name)) classesByName.set(metatype.name, new Set());
            classesByName.get(metatype.name)!.add(metatype);
          }
        } catch (error) {
          if (!(error instanceof RateLimitConfigurationError)) throw error;
          for (const problem of error.problems) problems.add(problem);
        }
      }
    }
    if (problems.size > 0) {
      throw new RateLimitConfigurationError([...problems]);
    }
    for (const [name, classes] of classesByName) {
      if (classes.size > 1) {
        new Logger('RateLimit').warn(
          `${classes.size} controllers are named ${name}: rules named after the class share their counters; give them distinct 'name's`,
        );
      }
    }
  }

  /** The rules that apply to one handler of one controller, in declaration order. */
  rulesFor(controller: Handler, handler: Handler): readonly RateLimitRule[] {
    let byHandler = this.rulesByClass.get(controller);
    if (!byHandler) this.rulesByClass.set(controller, (byHandler = new Map()));
    let rules = byHandler.get(handler);
    if (!rules) byHandler.set(handler, (rules = this.compile(controller, handler)));
    return rules;
  }

  private compile(controller: Handler, handler: Handler): readonly RateLimitRule[] {
    const className = controller.name;
    const route = `${className}.${handler.name}`;
    const problems: string[] = [];
    const classRules = this.declaredOn(controller, className, className, problems);
    const handlerRules = this.declaredOn(handler, route, route, problems);
    if (problems.length > 0) throw new RateLimitConfigurationError(problems);
    const replaced = new Set(handlerRules.map((rule) => rule.name));
    const rules = [...classRules.filter((rule) => !replaced.has(rule.name)), ...handlerRules];

    const skip = this.reflector.getAllAndOverride<true | string[] | undefined>(RATE_LIMIT_SKIP, [handler, controller]);
    if (skip === true) return NO_RULES;
    if (skip) {
      const unknown = skip.filter((name) => !rules.some((rule) => rule.name === name));
      if (unknown.length > 0) {
        throw new RateLimitConfigurationError(
          `@SkipRateLimit on ${route}: 'ruleNames' ${JSON.stringify(unknown)} match no rule here (rules: ${JSON.stringify(rules.map((r) => r.name))})`,
        );
      }
      return Object.freeze(rules.filter((rule) => !skip.includes(rule.name)));
    }
    return rules.length === 0 ? NO_RULES : Object.freeze(rules);
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

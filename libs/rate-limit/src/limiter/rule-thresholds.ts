import { Logger } from '@nestjs/common';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { parseLimitSettings, ruleWithSettings } from '../rules/limit-settings.js';
import { RateLimitConfigurationError, type RateLimitMode, type RateLimitRule } from '../rules/rate-limit-rule.js';
import type { AllowList } from '../rules/allow-list.js';
import type { RateLimitOverride } from './limit-values.js';

/** What a rule counts with for one request. */
export interface Thresholds {
  count: number;
  windowMs: number;
  algorithm: RateLimitAlgorithmName;
  mode: RateLimitMode;
  /** token-bucket and gcra: capacity (the rule's `burst`, else `count`). */
  burst: number;
  /** Requests the rule does not count: its `allow`, or the config centre's. */
  allow: AllowList | undefined;
}

/**
 * A rule's thresholds for this request: the config centre's values where valid, the decorator's
 * otherwise. Values are validated as bootstrap validates decorators, once per object the centre
 * returns (a centre returns the same object while its values stand). An invalid value (or a config
 * centre that throws) is warned about once per key and value, never per request, and the request
 * goes on with the decorator's values.
 */
export class RuleThresholds {
  private readonly warnings = new Warnings();
  /** The decorator's thresholds, with the module's mode where the rule has none. */
  private readonly declared = new WeakMap<RateLimitRule, Thresholds>();
  /** The thresholds last made of a centre's values, by the object that held them. */
  private readonly overridden = new WeakMap<RateLimitRule, { override: RateLimitOverride; thresholds: Thresholds }>();
  /** Per identity's values (`forIdentity`), per rule: the thresholds, and the centre's values they were made over. */
  private readonly perIdentity = new WeakMap<
    RateLimitOverride,
    WeakMap<RateLimitRule, { centre: RateLimitOverride | undefined; thresholds: Thresholds }>
  >();

  constructor(
    private readonly centre: LimitValuesSource,
    private readonly moduleMode: RateLimitMode,
  ) {}

  /** The decorator's thresholds, with the module's mode where the rule has none. */
  declaredOf(rule: RateLimitRule): Thresholds {
    let declared = this.declared.get(rule);
    if (!declared) this.declared.set(rule, (declared = this.thresholdsOf(rule)));
    return declared;
  }

  resolve(rule: RateLimitRule): Thresholds {
    const declared = this.declaredOf(rule);
    const { configKey } = rule;
    if (configKey === undefined) return declared;
    let override;
    try {
      override = this.centre.get(configKey);
    } catch (error) {
      this.warnings.once(
        `${configKey}#error`,
        `Config centre failed for '${configKey}' (${String(error)}); using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
      return declared;
    }
    if (override === undefined || override === null) return declared;
    const last = this.overridden.get(rule);
    if (last?.override === override) return last.thresholds;
    const thresholds = this.withOverride(rule, override) ?? declared;
    this.overridden.set(rule, { override, thresholds });
    return thresholds;
  }

  /**
   * The thresholds of an identity with values of its own for the rule's key: those values over the
   * centre's for the key, checked as `resolve` checks them (once per values object).
   */
  forIdentity(rule: RateLimitRule, values: RateLimitOverride): Thresholds {
    let byRule = this.perIdentity.get(values);
    if (!byRule) this.perIdentity.set(values, (byRule = new WeakMap()));
    let centre: RateLimitOverride | undefined;
    try {
      centre = this.centre.get(rule.configKey!) ?? undefined;
    } catch {
      centre = undefined; // said by `resolve`, which the request has been through
    }
    const last = byRule.get(rule);
    if (last && last.centre === centre) return last.thresholds;
    const thresholds = this.withOverride(rule, { ...centre, ...values }) ?? this.resolve(rule);
    byRule.set(rule, { centre, thresholds });
    return thresholds;
  }

  /**
   * Field by field: an invalid field means the decorator's value for that field (a bad window from
   * the environment must not undo a count an operator set live); valid fields that no rule of the
   * key could take together (a count below a fixed cost) mean the decorator's values for all.
   */
  private withOverride(rule: RateLimitRule, override: RateLimitOverride): Thresholds | undefined {
    const subject = `Config centre values ${JSON.stringify(override)} of '${rule.configKey}'`;
    const { settings, problems } = parseLimitSettings(override);
    const warn = (problem: string, using: string) =>
      this.warnings.once(`${rule.configKey}#${rule.name}#${JSON.stringify(override)}`, `${problem}; ${using}`);
    let overridden: RateLimitRule;
    try {
      overridden = ruleWithSettings(rule, settings, subject);
    } catch (error) {
      if (!(error instanceof RateLimitConfigurationError)) throw error;
      warn(
        [...problems, ...error.problems].join('; '),
        `using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
      return undefined;
    }
    if (problems.length > 0) {
      warn(`${subject}: ${problems.join('; ')}`, `those fields are the decorator's on ${rule.declaredOn}`);
    }
    return this.thresholdsOf(overridden);
  }

  private thresholdsOf(rule: RateLimitRule): Thresholds {
    return {
      count: rule.count,
      windowMs: rule.windowMs,
      algorithm: rule.algorithm,
      mode: rule.mode ?? this.moduleMode,
      burst: rule.burst ?? rule.count,
      allow: rule.allow,
    };
  }
}

/** Says each misconfiguration once, never per request. */
export class Warnings {
  private readonly logger = new Logger('RateLimit');
  private readonly said = new Set<string>();

  once(id: string, message: string): void {
    // Bounded: a config value that keeps changing to new invalid values is a misconfiguration, not
    // an attack, but the set must not grow without end either.
    if (this.said.has(id) || this.said.size >= 1_000) return;
    this.said.add(id);
    this.logger.warn(message);
  }
}

function describe(rule: RateLimitRule): string {
  return `count ${rule.count} per ${rule.windowMs} ms`;
}

/** Where the values of a config key are read: the config centre. */
export interface LimitValuesSource {
  get(configKey: string): RateLimitOverride | undefined | null;
}

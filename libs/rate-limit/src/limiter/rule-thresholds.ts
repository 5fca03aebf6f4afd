import { Logger } from '@nestjs/common';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { RateLimitConfigurationError, type RateLimitMode, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { parseLimitSettings, ruleWithSettings } from '../rules/limit-settings.js';
import type { RateLimitConfigCentre, RateLimitOverride } from './rate-limit-config-centre.js';

/** What a rule counts with for one request. */
export interface Thresholds {
  count: number;
  windowMs: number;
  algorithm: RateLimitAlgorithmName;
  mode: RateLimitMode;
  /** token-bucket and gcra: capacity (the rule's `burst`, else `count`). */
  burst: number;
}

/**
 * A rule's thresholds for this request: the config centre's values where valid, the decorator's
 * otherwise. Values are validated as bootstrap validates decorators, once per object the centre
 * returns (a centre returns the same object while its values stand). An invalid value (or a config
 * centre that throws) is warned about once per key and value, never per request, and the request
 * goes on with the decorator's values.
 */
export class RuleThresholds {
  private readonly logger = new Logger('RateLimit');
  private readonly warned = new Set<string>();
  /** The decorator's thresholds, with the module's mode where the rule has none. */
  private readonly declared = new WeakMap<RateLimitRule, Thresholds>();
  /** The thresholds last made of a centre's values, by the object that held them. */
  private readonly overridden = new WeakMap<RateLimitRule, { override: RateLimitOverride; thresholds: Thresholds }>();

  constructor(
    private readonly centre: RateLimitConfigCentre,
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
      this.warnOnce(
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
   * Field by field: an invalid field means the decorator's value for that field (a bad window from
   * the environment must not undo a count an operator set live); valid fields that no rule of the
   * key could take together (a count below a fixed cost) mean the decorator's values for all.
   */
  private withOverride(rule: RateLimitRule, override: RateLimitOverride): Thresholds | undefined {
    const subject = `Config centre values ${JSON.stringify(override)} of '${rule.configKey}'`;
    const { settings, problems } = parseLimitSettings(override);
    const warn = (problem: string, using: string) =>
      this.warnOnce(`${rule.configKey}#${rule.name}#${JSON.stringify(override)}`, `${problem}; ${using}`);
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
    };
  }

  private warnOnce(id: string, message: string): void {
    // Bounded: a config value that keeps changing to new invalid values is a misconfiguration, not
    // an attack, but the set must not grow without end either.
    if (this.warned.has(id) || this.warned.size >= 1_000) return;
    this.warned.add(id);
    this.logger.warn(message);
  }
}

function describe(rule: RateLimitRule): string {
  return `count ${rule.count} per ${rule.windowMs} ms`;
}

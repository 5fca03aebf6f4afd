import { Logger } from '@nestjs/common';
import { parseCount, parseDuration } from '../rules/duration.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { RateLimitConfigCentre } from './rate-limit-config-centre.js';

export interface Thresholds {
  count: number;
  windowMs: number;
}

/**
 * A rule's threshold for this request: the config centre's values where valid, the decorator's
 * otherwise. An invalid value (or a config centre that throws) is warned about once per key and
 * value, never per request, and the request goes on with the decorator's value.
 */
export class RuleThresholds {
  private readonly logger = new Logger('RateLimit');
  private readonly warned = new Set<string>();

  constructor(private readonly centre: RateLimitConfigCentre) {}

  resolve(rule: RateLimitRule): Thresholds {
    const { configKey } = rule;
    if (configKey === undefined) return rule;
    let override;
    try {
      override = this.centre.get(configKey);
    } catch (error) {
      this.warnOnce(
        `${configKey}#error`,
        `Config centre failed for '${configKey}' (${String(error)}); using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
      return rule;
    }
    if (override === undefined || override === null) return rule;
    return {
      count: this.field(rule, 'count', override.count, parseCount) ?? rule.count,
      windowMs: this.field(rule, 'window', override.window, parseDuration) ?? rule.windowMs,
    };
  }

  private field(
    rule: RateLimitRule,
    field: string,
    raw: unknown,
    parse: (raw: unknown) => number | undefined,
  ): number | undefined {
    if (raw === undefined || raw === null || raw === '') return undefined;
    const value = parse(raw);
    if (value === undefined) {
      this.warnOnce(
        `${rule.configKey}#${field}#${String(raw)}`,
        `Config centre value '${field}' = ${JSON.stringify(raw)} for '${rule.configKey}' is invalid; using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
    }
    return value;
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

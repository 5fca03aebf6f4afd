import { RateLimitConfigurationError, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { type LimitSettings, parseLimitSettings, ruleWithSettings } from '../rules/limit-settings.js';

/**
 * Every problem with values for a config key, each naming the key and the field: as values, and
 * with each rule of the key, exactly as bootstrap checks that rule's decorator. None: they may be
 * put in force.
 */
export function checkLimitValues(configKey: string, values: unknown, rules: readonly RateLimitRule[]): string[] {
  const subject = `Limits for config key '${configKey}'`;
  const { settings, problems, unknown } = parseLimitSettings(values);
  const found = [...problems, ...unknown].map((problem) => `${subject}: ${problem}`);
  if (found.length > 0) return found;
  return checkWithRules(settings, rules, subject);
}

function checkWithRules(settings: LimitSettings, rules: readonly RateLimitRule[], subject: string): string[] {
  const found: string[] = [];
  for (const rule of rules) {
    try {
      ruleWithSettings(rule, settings, subject);
    } catch (error) {
      if (!(error instanceof RateLimitConfigurationError)) throw error;
      found.push(...error.problems);
    }
  }
  return found;
}

import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { MAX_DURATION_MS, parseCount, parseDuration } from './duration.js';
import {
  RATE_LIMIT_MODES,
  type RateLimitMode,
  type RateLimitRule,
  RateLimitConfigurationError,
  ruleOptions,
  validateRule,
} from './rate-limit-rule.js';
import type { RateLimitOverride } from '../limiter/limit-values.js';
import { AllowList } from './allow-list.js';
import { describeValue as show } from './describe-value.js';

/** A config centre's values for one `configKey`, each checked on its own. */
export interface LimitSettings {
  count?: number;
  windowMs?: number;
  algorithm?: RateLimitAlgorithmName;
  mode?: RateLimitMode;
  /** The allow list in force instead of the rule's; `null`: none (an empty list given). */
  allow?: AllowList | null;
}

/** The fields a config centre may set, as `RateLimitOverride` names them. */
export const LIMIT_FIELDS = ['count', 'window', 'algorithm', 'mode', 'allow'] as const;

/**
 * Parses a config centre's values field by field. An absent, null or empty field is unset; any
 * other that is invalid is a problem naming the field, and so is any field not in `LIMIT_FIELDS`
 * (in `unknown`: a reader of values written by others may ignore those), `__proto__`,
 * `constructor` and `prototype` included. Only the object's own fields are read: one it inherits
 * (from a prototype a `__proto__` field set on the way) is none of its values.
 */
export function parseLimitSettings(raw: unknown): { settings: LimitSettings; problems: string[]; unknown: string[] } {
  const settings: LimitSettings = {};
  const problems: string[] = [];
  const unknown: string[] = [];
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    return { settings, problems: [`must be an object of ${LIMIT_FIELDS.join(', ')}, got ${show(raw)}`], unknown };
  }
  const values = raw as Record<string, unknown>;
  for (const field of Object.keys(values)) {
    if (!(LIMIT_FIELDS as readonly string[]).includes(field) && values[field] !== undefined) {
      unknown.push(`'${field}' is not a setting (settings: ${LIMIT_FIELDS.join(', ')})`);
    }
  }
  const given = (field: keyof RateLimitOverride) => {
    const value = Object.hasOwn(values, field) ? values[field] : undefined;
    return value === undefined || value === null || value === '' ? undefined : value;
  };
  const count = given('count');
  if (count !== undefined) {
    settings.count = parseCount(count);
    if (settings.count === undefined) problems.push(`'count' must be a positive whole number, got ${show(count)}`);
  }
  const window = given('window');
  if (window !== undefined) {
    settings.windowMs = parseDuration(window);
    if (settings.windowMs === undefined) {
      problems.push(
        `'window' must be a positive duration of at most ${MAX_DURATION_MS / 86_400_000} days, such as 500 (ms), '1s', '1m', got ${show(window)}`,
      );
    }
  }
  const algorithm = given('algorithm');
  if (algorithm !== undefined) {
    if (ALGORITHM_NAMES.includes(algorithm as RateLimitAlgorithmName))
      settings.algorithm = algorithm as RateLimitAlgorithmName;
    else problems.push(`'algorithm' must be one of ${ALGORITHM_NAMES.join(', ')}, got ${show(algorithm)}`);
  }
  const mode = given('mode');
  if (mode !== undefined) {
    if (RATE_LIMIT_MODES.includes(mode as RateLimitMode)) settings.mode = mode as RateLimitMode;
    else problems.push(`'mode' must be one of ${RATE_LIMIT_MODES.join(', ')}, got ${show(mode)}`);
  }
  let allow: unknown = given('allow');
  if (allow !== undefined) {
    // An env variable or a CLI argument carries the list as JSON.
    if (typeof allow === 'string') {
      try {
        allow = JSON.parse(allow) as unknown;
      } catch {
        // Said below: a string is no allow list.
      }
    }
    const parsed = AllowList.parse(allow);
    if (parsed.problems.length > 0) problems.push(...parsed.problems);
    else settings.allow = parsed.list ?? null;
  }
  return { settings, problems, unknown };
}

/**
 * The rule with a config centre's settings in force, validated exactly as bootstrap validates the
 * decorator (a `burst` or a `lease` with an algorithm that has none, a fixed `cost` above the new
 * `count`: each refused; a `lease` above the new `count` is the count). Throws
 * `RateLimitConfigurationError` naming `subject`.
 */
export function ruleWithSettings(rule: RateLimitRule, settings: LimitSettings, subject: string): RateLimitRule {
  const options = ruleOptions(rule);
  if (settings.count !== undefined && options.concurrency !== undefined) {
    options.concurrency = settings.count;
  } else if (settings.count !== undefined) {
    options.count = settings.count;
    // A lease is how a hot counter is served, not how much it admits: a count cut below it in an
    // incident must hold, and does (a lease never admits past the count in force).
    if (options.lease !== undefined && options.lease > settings.count) {
      options.lease = settings.count >= 2 ? settings.count : undefined;
    }
  }
  if (settings.windowMs !== undefined) options.window = settings.windowMs;
  if (settings.algorithm !== undefined) options.algorithm = settings.algorithm;
  if (settings.mode !== undefined) options.mode = settings.mode;
  if (settings.allow !== undefined) options.allow = settings.allow?.source;
  return validateRule(options, rule.declaredOn, rule.name, `${subject} for rule ${rule.name} on ${rule.declaredOn}`);
}

/** `LimitSettings` back in a config centre's terms (a window in ms), for storing and showing. */
export function settingsAsOverride(settings: LimitSettings): RateLimitOverride {
  const override: RateLimitOverride = {};
  if (settings.count !== undefined) override.count = settings.count;
  if (settings.windowMs !== undefined) override.window = settings.windowMs;
  if (settings.algorithm !== undefined) override.algorithm = settings.algorithm;
  if (settings.mode !== undefined) override.mode = settings.mode;
  if (settings.allow !== undefined) override.allow = settings.allow?.source ?? {};
  return override;
}

/** Throws the problems found, if any, each naming `subject`. */
export function throwProblems(subject: string, problems: readonly string[]): void {
  if (problems.length > 0) throw new RateLimitConfigurationError(problems.map((problem) => `${subject}: ${problem}`));
}

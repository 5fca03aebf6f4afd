import type { ExecutionContext } from '@nestjs/common';
import { type Duration, parseCount, parseDuration } from './duration.js';

/**
 * Computes the identity a request is counted under (a user id, an API key, a tenant).
 * Throw an `HttpException` (e.g. `BadRequestException`) to refuse a request that has none.
 */
export type RateLimitIdentityResolver = (context: ExecutionContext) => string | Promise<string>;

/**
 * Who shares a counter: `'ip'` (the client address as the HTTP adapter reports it, honouring the
 * app's trust-proxy setting), `'global'` (one counter for the rule), or a resolver function.
 */
export type RateLimitBy = 'ip' | 'global' | RateLimitIdentityResolver;

/** What `@RateLimit()` takes. */
export interface RateLimitOptions {
  /** Requests admitted per window: a positive whole number. */
  count: number;
  /** Window length: milliseconds or a duration string (`'500ms'`, `'1s'`, `'1m'`, `'1h'`, `'1d'`). */
  window: Duration;
  /** Key in the config centre whose `count` / `window` override the values above at run time. */
  configKey?: string;
  /** Who shares a counter. Default `'ip'`. */
  by?: RateLimitBy;
  /**
   * Stable name of the rule: part of the Redis key, and how a handler rule replaces a class rule.
   * Default `Controller` for a class rule (one budget for all its handlers), `Controller.method`
   * for a handler rule.
   */
  name?: string;
}

/** A rule after validation at bootstrap, as the guard uses it on every request. */
export interface RateLimitRule {
  readonly name: string;
  /** Where it was declared, for messages: `Controller` or `Controller.method`. */
  readonly declaredOn: string;
  readonly count: number;
  readonly windowMs: number;
  readonly configKey: string | undefined;
  readonly by: RateLimitBy;
}

/** Thrown at bootstrap for a rule that cannot work; the message names the route and the field. */
export class RateLimitConfigurationError extends Error {
  override readonly name = 'RateLimitConfigurationError';
  /** Each problem found, one sentence each. */
  readonly problems: readonly string[];

  constructor(problems: string | readonly string[]) {
    const list = typeof problems === 'string' ? [problems] : problems;
    super(list.length === 1 ? list[0] : `Invalid rate limits:\n  ${list.join('\n  ')}`);
    this.problems = list;
  }
}

const RULE_NAME = /^[A-Za-z0-9._:$-]{1,64}$/;

export function validateRule(options: RateLimitOptions, declaredOn: string, defaultName: string): RateLimitRule {
  const fail = (field: string, problem: string, value: unknown): never => {
    throw new RateLimitConfigurationError(`@RateLimit on ${declaredOn}: '${field}' ${problem}, got ${describe(value)}`);
  };
  if (options === null || typeof options !== 'object') fail('options', 'must be an object', options);

  const count = parseCount(options.count);
  if (count === undefined || typeof options.count !== 'number') {
    fail('count', 'must be a positive whole number', options.count);
  }
  const windowMs = parseDuration(options.window);
  if (windowMs === undefined) {
    fail(
      'window',
      "must be a positive whole number of milliseconds or a duration such as '500ms', '1s', '1m', '1h', '1d'",
      options.window,
    );
  }
  const name = options.name ?? defaultName;
  if (typeof name !== 'string' || !RULE_NAME.test(name)) {
    fail('name', 'must be 1 to 64 characters of letters, digits and . _ : $ -', options.name);
  }
  const { configKey } = options;
  if (configKey !== undefined && (typeof configKey !== 'string' || configKey.trim() === '')) {
    fail('configKey', 'must be a non-empty string', configKey);
  }
  const by = options.by ?? 'ip';
  if (by !== 'ip' && by !== 'global' && typeof by !== 'function') {
    fail('by', "must be 'ip', 'global' or a function of the ExecutionContext", by);
  }
  return { name, declaredOn, count: count!, windowMs: windowMs!, configKey, by };
}

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'function') return 'a function';
  return String(value);
}

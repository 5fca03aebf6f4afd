import { ALGORITHM_NAMES } from '../algorithms/algorithm.js';
import { MAX_DURATION_MS, parseCount, parseDuration } from './duration.js';
import { STORE_ERROR_POLICIES } from '../resilience/store-error-policy.js';
import { ruleKeyId } from '../store/key-layout.js';
import { AllowList } from './allow-list.js';
import { describeValue as describe } from './describe-value.js';
import { SLOT_LEASE_MS, concurrencyOf } from './concurrency-cap.js';
import { settledCost } from './settle-cost-option.js';
import { waitOf } from './wait-option.js';
import { type Fail, RateLimitConfigurationError, type RateLimitRule } from './compiled-rule.js';
import {
  COUNT_ON,
  RATE_LIMIT_MODES,
  type RateLimitBy,
  type RateLimitOptions,
  type RateLimitSettleCost,
  type RateLimitSkipIf,
} from './rule-options.js';

export type {
  RateLimitBy,
  RateLimitCost,
  RateLimitSkipIf,
  RateLimitTierResolver,
  RateLimitTiers,
  RateLimitOptions,
  RateLimitSettleCost,
  RateLimitMode,
  RateLimitCountOn,
} from './rule-options.js';
export { RATE_LIMIT_MODES } from './rule-options.js';
export { RateLimitConfigurationError, type RateLimitRule, ruleOptions } from './compiled-rule.js';

/** Options that 0.3.0 folded into others before its release: what each is now, so an upgrade is told. */
const FOLDED: Readonly<Record<string, string>> = {
  tier: "is now 'tiers.of' (0.3): tiers: { of: (ctx) => name, limits: { ... } }",
  maxCost: "is now 'settleCost.max' (0.3): settleCost: { actual: (result) => units, max }",
};

// No ':' (it separates key parts) and no braces (they pick Cluster slots).
const RULE_NAME = /^[A-Za-z0-9._$-]{1,64}$/;
const TIER_NAME = /^[A-Za-z0-9_-]{1,32}$/;

/**
 * @param subject how messages name the rule: `@RateLimit on Controller.method` by default.
 */
export function validateRule(
  options: RateLimitOptions,
  declaredOn: string,
  defaultName: string | undefined,
  subject = `@RateLimit on ${declaredOn}`,
): RateLimitRule {
  const fail = (field: string, problem: string, value: unknown): never => {
    throw new RateLimitConfigurationError(`${subject}: '${field}' ${problem}, got ${describe(value)}`);
  };
  if (options === null || typeof options !== 'object') fail('options', 'must be an object', options);

  const concurrency = concurrencyOf(options, fail);
  if (options.wait !== undefined && options.count === undefined && concurrency === undefined) {
    fail('wait', "needs a limit to wait for: 'count' and 'window', or 'concurrency'", options.wait);
  }
  const count = concurrency ?? parseCount(options.count);
  if (count === undefined || (concurrency === undefined && typeof options.count !== 'number')) {
    const or = options.count === undefined ? " (or 'concurrency' for a cap on requests in flight)" : '';
    fail('count', `must be a positive whole number${or}`, options.count);
  }
  const windowMs = concurrency === undefined ? parseDuration(options.window) : SLOT_LEASE_MS;
  if (windowMs === undefined) {
    fail(
      'window',
      `must be a positive whole number of milliseconds or a duration such as '500ms', '1s', '1m', '1h', '1d', of at most ${MAX_DURATION_MS / 86_400_000} days`,
      options.window,
    );
  }
  // A cap beside a rate on one handler: two rules, two default names.
  const wait = waitOf(options, windowMs!, fail);
  const name = options.name ?? (concurrency === undefined || !defaultName ? defaultName : `${defaultName}.concurrency`);
  if (typeof name !== 'string' || !RULE_NAME.test(name)) {
    fail('name', 'must be 1 to 64 characters of letters, digits and . _ $ -', options.name);
  }
  const { configKey } = options;
  if (configKey !== undefined && (typeof configKey !== 'string' || configKey.trim() === '')) {
    fail('configKey', 'must be a non-empty string', configKey);
  }
  const by = options.by ?? 'ip';
  if (by !== 'ip' && by !== 'global' && typeof by !== 'function') {
    fail('by', "must be 'ip', 'global' or a function of the ExecutionContext", by);
  }
  const algorithm = concurrency === undefined ? (options.algorithm ?? 'fixed-window') : 'sliding-log';
  if (!ALGORITHM_NAMES.includes(algorithm))
    fail('algorithm', `must be one of ${ALGORITHM_NAMES.join(', ')}`, algorithm);
  const { burst } = options;
  if (burst !== undefined) {
    if (algorithm !== 'token-bucket' && algorithm !== 'gcra') {
      fail('burst', "applies only to the 'token-bucket' and 'gcra' algorithms", burst);
    }
    if (typeof burst !== 'number' || parseCount(burst) === undefined)
      fail('burst', 'must be a positive whole number', burst);
  }
  const cost = options.cost ?? 1;
  if (typeof cost !== 'function') {
    if (typeof cost !== 'number' || parseCount(cost) === undefined) {
      fail('cost', 'must be a positive whole number or a function of the ExecutionContext', cost);
    }
    if (cost > (burst ?? count!))
      fail('cost', `is more than the rule admits at once (${burst ?? count}), so no request could pass`, cost);
  }
  let blockMs = 0;
  if (options.blockFor !== undefined) {
    blockMs =
      parseDuration(options.blockFor) ??
      fail('blockFor', `must be a positive duration of at most ${MAX_DURATION_MS / 86_400_000} days`, options.blockFor);
  }
  const countOn = options.countOn ?? 'all';
  if (!COUNT_ON.includes(countOn)) fail('countOn', `must be one of ${COUNT_ON.join(', ')}`, countOn);
  const { onStoreError } = options;
  if (onStoreError !== undefined && !STORE_ERROR_POLICIES.includes(onStoreError)) {
    fail('onStoreError', `must be one of ${STORE_ERROR_POLICIES.join(', ')}`, onStoreError);
  }
  const { mode } = options;
  if (mode !== undefined && !RATE_LIMIT_MODES.includes(mode)) {
    fail('mode', `must be one of ${RATE_LIMIT_MODES.join(', ')}`, mode);
  }
  let lease = 0;
  if (options.lease !== undefined) {
    lease = options.lease;
    if (typeof lease !== 'number' || parseCount(lease) === undefined || lease < 2) {
      fail('lease', 'must be a whole number of at least 2', options.lease);
    }
    if (lease > count!) fail('lease', `is more than the rule admits in a window (${count})`, lease);
    if (algorithm !== 'fixed-window') fail('lease', "applies only to the 'fixed-window' algorithm", lease);
    // A penalty is set by the refusal that ends a window in Redis, which a lease never asks for.
    if (blockMs > 0) fail('lease', "cannot be combined with 'blockFor'", lease);
    // A refund would have to reach the instance that holds the unit: it is simply not leased.
    if (countOn !== 'all') fail('lease', "cannot be combined with 'countOn'", lease);
  }
  const { skipIf } = options;
  if (skipIf !== undefined && typeof skipIf !== 'function') {
    fail('skipIf', 'must be a function of the ExecutionContext', skipIf);
  }
  const parsedAllow = AllowList.parse(options.allow);
  if (parsedAllow.problems.length > 0) {
    throw new RateLimitConfigurationError(parsedAllow.problems.map((problem) => `${subject}: ${problem}`));
  }
  for (const field of Object.keys(FOLDED)) {
    if (Object.hasOwn(options, field))
      fail(field, FOLDED[field], (options as unknown as Record<string, unknown>)[field]);
  }
  const tiers = tierRules(options, declaredOn, defaultName, subject, fail);
  const { settleCost, maxCost } = settledCost(options, cost, countOn, fail);
  const { nearLimit } = options;
  if (nearLimit !== undefined && !(typeof nearLimit === 'number' && nearLimit > 0 && nearLimit < 1)) {
    fail('nearLimit', 'must be a share of the limit above 0 and below 1 (0.8: 80%)', nearLimit);
  }
  return {
    name: name!,
    keyId: ruleKeyId(name!),
    declaredOn,
    count: count!,
    windowMs: windowMs!,
    configKey,
    by,
    algorithm,
    burst,
    cost,
    blockMs,
    countOn,
    onStoreError,
    lease,
    mode,
    skipIf,
    allow: parsedAllow.list,
    tiers,
    tier: tiers ? options.tiers!.of : undefined,
    nearLimit,
    settleCost,
    maxCost,
    afterGuards: afterGuardsOf(
      by,
      tiers !== undefined,
      skipIf,
      settleCost,
      countOn !== 'all' || concurrency !== undefined,
    ),
    ...(concurrency === undefined ? {} : { concurrency }),
    ...(wait === undefined ? {} : { wait }),
  };
}

/** The rule of each of `tiers.limits`, validated as the rule itself with that tier's thresholds. */
function tierRules(
  options: RateLimitOptions,
  declaredOn: string,
  defaultName: string | undefined,
  subject: string,
  fail: Fail,
): Map<string, RateLimitRule> | undefined {
  const given = options.tiers;
  if (given === undefined) return undefined;
  if (given === null || typeof given !== 'object' || Array.isArray(given)) {
    fail(
      'tiers',
      'must be an object of `of` and `limits`, such as { of: (ctx) => plan, limits: { pro: 5000 } }',
      given,
    );
  }
  if (typeof given.of !== 'function') {
    fail('tiers.of', "must be a function of the ExecutionContext naming one of 'tiers.limits'", given.of);
  }
  const { limits } = given;
  if (limits === null || typeof limits !== 'object' || Array.isArray(limits)) {
    fail('tiers.limits', 'must be an object of tier names and limits, such as { pro: 5000 }', limits);
  }
  if (options.lease !== undefined) fail('tiers', "cannot be combined with 'lease'", given);
  const tiers = new Map<string, RateLimitRule>();
  for (const [tierName, limit] of Object.entries(limits)) {
    const field = `tiers.limits.${tierName}`;
    if (!TIER_NAME.test(tierName)) fail(field, 'is not a tier name: 1 to 32 letters, digits, _ or -', tierName);
    const values = typeof limit === 'number' ? { count: limit } : limit;
    if (values === null || typeof values !== 'object') {
      fail(field, 'must be a count, or an object of count, window and burst', limit);
    }
    const { configKey } = options;
    tiers.set(tierName, {
      tierName,
      ...validateRule(
        {
          ...options,
          count: values.count,
          window: values.window ?? options.window,
          burst: values.burst,
          configKey: configKey === undefined ? undefined : `${configKey}.${tierName}`,
          name: options.name ?? defaultName,
          tiers: undefined,
        },
        declaredOn,
        defaultName,
        `${subject}, tier '${tierName}'`,
      ),
    });
  }
  if (tiers.size === 0) fail('tiers.limits', 'must name at least one tier', limits);
  return tiers;
}

function afterGuardsOf(
  by: RateLimitBy,
  tiered: boolean,
  skipIf: RateLimitSkipIf | undefined,
  settleCost: RateLimitSettleCost | undefined,
  heldUntilEnd: boolean,
): RateLimitRule['afterGuards'] {
  const http = typeof by === 'function' || tiered || skipIf !== undefined || settleCost !== undefined;
  // HTTP settles `countOn` units and a cap's slots by the response, which always ends; elsewhere the
  // handler's outcome does.
  return { http, elsewhere: http || heldUntilEnd };
}

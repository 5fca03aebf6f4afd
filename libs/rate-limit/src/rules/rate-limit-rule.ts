import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { MAX_DURATION_MS, parseCount, parseDuration } from './duration.js';
import { type RateLimitStoreErrorPolicy, STORE_ERROR_POLICIES } from '../resilience/store-error-policy.js';
import { ruleKeyId } from '../store/key-layout.js';
import { AllowList } from './allow-list.js';
import {
  COUNT_ON,
  RATE_LIMIT_MODES,
  type RateLimitBy,
  type RateLimitCost,
  type RateLimitCountOn,
  type RateLimitMode,
  type RateLimitOptions,
  type RateLimitSettleCost,
  type RateLimitSkipIf,
  type RateLimitTierResolver,
} from './rule-options.js';

export type {
  RateLimitIdentity,
  RateLimitIdentityResolver,
  RateLimitBy,
  RateLimitCost,
  RateLimitSkipIf,
  RateLimitTierResolver,
  RateLimitTier,
  RateLimitOptions,
  RateLimitSettleCost,
  RateLimitMode,
  RateLimitCountOn,
} from './rule-options.js';
export { RATE_LIMIT_MODES } from './rule-options.js';

/** A rule after validation at bootstrap, as the guard uses it on every request. */
export interface RateLimitRule {
  readonly name: string;
  /** The rule in its keys (`ruleKeyId` of the name): computed once here, not per request. */
  readonly keyId: string;
  /** Where it was declared, for messages: `Controller` or `Controller.method`. */
  readonly declaredOn: string;
  readonly count: number;
  readonly windowMs: number;
  readonly configKey: string | undefined;
  readonly by: RateLimitBy;
  readonly algorithm: RateLimitAlgorithmName;
  /** Explicit burst; without it, the (possibly overridden) count. */
  readonly burst: number | undefined;
  readonly cost: RateLimitCost;
  /** 0: no penalty. */
  readonly blockMs: number;
  readonly countOn: RateLimitCountOn;
  /** `undefined`: the module's policy. */
  readonly onStoreError: RateLimitStoreErrorPolicy | undefined;
  /** Units an instance takes from a shared store at once; 0: none, every request asks. */
  readonly lease: number;
  /** `undefined`: the module's mode. */
  readonly mode: RateLimitMode | undefined;
  readonly skipIf: RateLimitSkipIf | undefined;
  /** @internal The rule's `allow`, made ready for requests. */
  readonly allow: AllowList | undefined;
  /** Per tier name, the rule with that tier's thresholds (same name, key id and counters). */
  readonly tiers: ReadonlyMap<string, RateLimitRule> | undefined;
  readonly tier: RateLimitTierResolver | undefined;
  readonly settleCost: RateLimitSettleCost | undefined;
  /** With `settleCost`, the most one request can cost; undefined otherwise. */
  readonly maxCost: RateLimitCost | undefined;
  /** A share of the limit whose crossing is reported; undefined: none. */
  readonly nearLimit: number | undefined;
  /** Set for the rule of one of another rule's `tiers`: that tier's name. */
  readonly tierName?: string;
  /** Set for a rule of the module's `defaults`, as applied to a handler. */
  readonly fromDefaults?: true;
  /**
   * Whether `RateLimitInterceptor` decides the rule, after the app's guards, instead of
   * `RateLimitGuard` before them: on HTTP, and on GraphQL and WebSocket (`elsewhere`).
   * - It reads the request through a function of the app's (`by`, `tier`, `skipIf`), which may read
   *   what an authentication guard sets (`req.user`).
   * - Or the interceptor settles it (`settleCost`; outside HTTP, `countOn`), which a later guard's
   *   refusal never reaches: a request refused there holds nothing.
   * Every other rule, counted by client address or for all, stays before the app's guards whatever
   * its neighbours need: a login's per-address rule counts the requests an auth guard refuses.
   */
  readonly afterGuards: { readonly http: boolean; readonly elsewhere: boolean };
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

  const count = parseCount(options.count);
  if (count === undefined || typeof options.count !== 'number') {
    fail('count', 'must be a positive whole number', options.count);
  }
  const windowMs = parseDuration(options.window);
  if (windowMs === undefined) {
    fail(
      'window',
      `must be a positive whole number of milliseconds or a duration such as '500ms', '1s', '1m', '1h', '1d', of at most ${MAX_DURATION_MS / 86_400_000} days`,
      options.window,
    );
  }
  const name = options.name ?? defaultName;
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
  const algorithm = options.algorithm ?? 'fixed-window';
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
  const { tier } = options;
  let tiers: Map<string, RateLimitRule> | undefined;
  if (options.tiers !== undefined) {
    if (options.tiers === null || typeof options.tiers !== 'object' || Array.isArray(options.tiers)) {
      fail('tiers', 'must be an object of tier names and limits, such as { pro: 5000 }', options.tiers);
    }
    if (typeof tier !== 'function')
      fail('tier', "must be a function of the ExecutionContext naming one of 'tiers'", tier);
    if (options.lease !== undefined) fail('tiers', "cannot be combined with 'lease'", options.tiers);
    tiers = new Map();
    for (const [tierName, limit] of Object.entries(options.tiers!)) {
      if (!TIER_NAME.test(tierName))
        fail(`tiers.${tierName}`, 'is not a tier name: 1 to 32 letters, digits, _ or -', tierName);
      const given = typeof limit === 'number' ? { count: limit } : limit;
      if (given === null || typeof given !== 'object') {
        fail(`tiers.${tierName}`, 'must be a count, or an object of count, window and burst', limit);
      }
      tiers.set(tierName, {
        tierName,
        ...validateRule(
          {
            ...options,
            count: given.count,
            window: given.window ?? options.window,
            burst: given.burst,
            configKey: configKey === undefined ? undefined : `${configKey}.${tierName}`,
            name,
            tiers: undefined,
            tier: undefined,
          },
          declaredOn,
          defaultName,
          `${subject}, tier '${tierName}'`,
        ),
      });
    }
    if (tiers.size === 0) fail('tiers', 'must name at least one tier', options.tiers);
  } else if (tier !== undefined) fail('tier', "needs 'tiers' to pick from", tier);
  const { settleCost } = options;
  if (settleCost !== undefined) {
    if (typeof settleCost !== 'function')
      fail('settleCost', 'must be a function of the result and the context', settleCost);
    // Each decides what stays counted after the handler; one rule takes one of them.
    if (countOn !== 'all') fail('settleCost', "cannot be combined with 'countOn'", settleCost);
    // A leased unit is this instance's, which a charge past it could not reach.
    if (options.lease !== undefined) fail('settleCost', "cannot be combined with 'lease'", settleCost);
  }
  const { maxCost } = options;
  if (settleCost !== undefined || maxCost !== undefined) {
    if (settleCost === undefined) fail('maxCost', "applies only with 'settleCost'", maxCost);
    // Without it, requests in flight together could each overdraw the budget: no bound at all.
    if (maxCost === undefined) {
      fail(
        'maxCost',
        "is required with 'settleCost': the most one request can really cost, so that requests in flight together never overdraw the budget by more than one request's overdraft",
        maxCost,
      );
    }
    if (typeof maxCost !== 'function') {
      if (typeof maxCost !== 'number' || parseCount(maxCost) === undefined)
        fail('maxCost', 'must be a positive whole number or a function of the ExecutionContext', maxCost);
      if (typeof cost === 'number' && maxCost! < cost)
        fail('maxCost', `is less than the reservation ('cost': ${cost})`, maxCost);
    }
  }
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
    tier: tiers ? tier : undefined,
    nearLimit,
    settleCost,
    maxCost,
    afterGuards: afterGuardsOf(by, tiers !== undefined, skipIf, settleCost, countOn),
  };
}

function afterGuardsOf(
  by: RateLimitBy,
  tiered: boolean,
  skipIf: RateLimitSkipIf | undefined,
  settleCost: RateLimitSettleCost | undefined,
  countOn: RateLimitCountOn,
): RateLimitRule['afterGuards'] {
  const http = typeof by === 'function' || tiered || skipIf !== undefined || settleCost !== undefined;
  // HTTP settles `countOn` units by the response, which always ends; elsewhere the handler's outcome does.
  return { http, elsewhere: http || countOn !== 'all' };
}

/**
 * The options a rule was validated from, as far as they can be rebuilt: to validate it again with
 * values from a config centre, exactly as bootstrap validated the decorator.
 */
export function ruleOptions(rule: RateLimitRule): RateLimitOptions {
  const options: RateLimitOptions = {
    count: rule.count,
    window: rule.windowMs,
    name: rule.name,
    by: rule.by,
    algorithm: rule.algorithm,
    cost: rule.cost,
    countOn: rule.countOn,
  };
  if (rule.configKey !== undefined) options.configKey = rule.configKey;
  if (rule.burst !== undefined) options.burst = rule.burst;
  if (rule.blockMs > 0) options.blockFor = rule.blockMs;
  if (rule.onStoreError !== undefined) options.onStoreError = rule.onStoreError;
  if (rule.lease > 0) options.lease = rule.lease;
  if (rule.mode !== undefined) options.mode = rule.mode;
  if (rule.skipIf !== undefined) options.skipIf = rule.skipIf;
  if (rule.allow !== undefined) options.allow = rule.allow.source;
  if (rule.nearLimit !== undefined) options.nearLimit = rule.nearLimit;
  if (rule.settleCost !== undefined) options.settleCost = rule.settleCost;
  if (rule.maxCost !== undefined) options.maxCost = rule.maxCost;
  return options;
}

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'function') return 'a function';
  return String(value);
}

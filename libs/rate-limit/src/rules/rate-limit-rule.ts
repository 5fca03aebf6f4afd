import type { ExecutionContext } from '@nestjs/common';
import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { type Duration, MAX_DURATION_MS, parseCount, parseDuration } from './duration.js';
import { type RateLimitStoreErrorPolicy, STORE_ERROR_POLICIES } from '../resilience/store-error-policy.js';
import { ruleKeyId } from '../store/key-layout.js';
import { AllowList, type RateLimitAllowList } from './allow-list.js';

/** What a `by` function may give: an identity, or none (`undefined`, `null`, `''`). */
export type RateLimitIdentity = string | number | null | undefined;

/**
 * Computes the identity a request is counted under (a user id, an API key, a tenant). It runs after
 * the app's guards, so it can read what an authentication guard set (`req.user?.id`). Requests it
 * gives no identity share one anonymous counter; throw an `HttpException` (e.g.
 * `BadRequestException`) to refuse them instead.
 */
export type RateLimitIdentityResolver = (context: ExecutionContext) => RateLimitIdentity | Promise<RateLimitIdentity>;

/**
 * Who shares a counter: `'ip'` (the client address as the HTTP adapter reports it, honouring the
 * app's trust-proxy setting), `'global'` (one counter for the rule), or a resolver function.
 */
export type RateLimitBy = 'ip' | 'global' | RateLimitIdentityResolver;

/** Units a request consumes: a number, or a function of the context (e.g. upload size in MB). */
export type RateLimitCost = number | ((context: ExecutionContext) => number | Promise<number>);

/**
 * Whether a request skips a rule (module-wide: every rule). It runs after the app's guards, as `by`
 * does. One that throws or rejects skips nothing: the request is decided as if it were not there
 * (the error is logged by sampling).
 */
export type RateLimitSkipIf = (context: ExecutionContext) => boolean | Promise<boolean>;

/**
 * The tier (plan) a request is counted under: a name of the rule's `tiers`. None (`undefined`,
 * `null`, `''`): the rule's own `count` and `window`. It runs after the app's guards, as `by` does.
 */
export type RateLimitTierResolver = (
  context: ExecutionContext,
) => string | null | undefined | Promise<string | null | undefined>;

/** A tier's limit: a count per the rule's window, or its own thresholds. */
export type RateLimitTier = number | { count: number; window?: Duration; burst?: number };

/** What `@RateLimit()` takes. */
export interface RateLimitOptions {
  /**
   * Requests admitted per window: a positive whole number. With `tiers`: the limit of a request the
   * `tier` resolver names no tier for.
   */
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
  /** How to count. Default `'fixed-window'`. */
  algorithm?: RateLimitAlgorithmName;
  /** token-bucket and gcra: units that may arrive at once. Default `count`. */
  burst?: number;
  /** Units a request consumes. Default 1. */
  cost?: RateLimitCost;
  /** Once the rule rejects an identity, keep rejecting it for this long (a penalty). */
  blockFor?: Duration;
  /**
   * Which requests stay counted: `'all'` (default), `'success'` (the response's status is below
   * 400) or `'failure'` (400 or above, or the response never finished: a thrown handler, a timeout,
   * a broken stream). The others are refunded when the response ends. On a GraphQL operation or a
   * WebSocket message, the handler decides: its result is a success, its error a failure.
   */
  countOn?: RateLimitCountOn;
  /** What this rule decides when the store fails; default: the module's `storeErrors.policy`. */
  onStoreError?: RateLimitStoreErrorPolicy;
  /**
   * For a counter hotter than one Redis key can serve (a `'global'` rule at tens of thousands of
   * requests per second): each instance takes this many units of the window from Redis at once and
   * admits from them without asking again, so Redis sees one call per `lease` requests. Never more
   * than `count` are admitted in a window across instances; up to `lease` units per instance may go
   * unused when a window ends. Fixed-window rules without `blockFor` or `countOn` only; the embedded
   * store (no Redis) counts exactly and ignores it. Default: none (every request asks Redis).
   */
  lease?: number;
  /**
   * `'enforce'` rejects past the limit; `'shadow'` counts and decides the same but never rejects
   * (would-be rejections are logged by sampling and counted), to try a limit on real traffic first;
   * `'off'` skips the rule. A config centre's `mode` for the rule's `configKey` wins. Default: the
   * module's `mode` (`'enforce'`).
   */
  mode?: RateLimitMode;
  /** Requests this rule does not count (nor sends headers for): a function of the context. */
  skipIf?: RateLimitSkipIf;
  /**
   * Requests this rule does not count, by address, identity or user agent. A config centre's
   * `allow` for the rule's `configKey` replaces it while the app runs.
   */
  allow?: RateLimitAllowList;
  /**
   * Limits per plan: `{ pro: 5000, partner: { count: 20000, window: '1m' } }`, picked per request by
   * `tier`. A request of no tier (or one not declared here, said once) gets `count` and `window`.
   * Tiers count on one counter per identity: an identity that changes plan keeps what it used. With
   * a `configKey`, tier `pro` reads its live values from `<configKey>.pro`.
   */
  tiers?: Readonly<Record<string, RateLimitTier>>;
  /** Which of `tiers` a request is counted under. Required with `tiers`. */
  tier?: RateLimitTierResolver;
  /**
   * A share of the limit (above 0, below 1; `0.8`: 80%): the admission that takes an identity's use
   * to it or past it is counted in the metrics (`near_limit_total`) and given to the module's
   * `onNearLimit`, so an app can warn a customer before the 429. Once per crossing, not per request.
   */
  nearLimit?: number;
  /**
   * The units a request really cost, known only after its handler (tokens an LLM call used, rows
   * exported): a function of the handler's result. `cost` is then what is reserved up front (an
   * estimate); after the handler the difference is refunded or charged, in one store call. An
   * overdraft is charged in full, past the limit if need be, so the identity's next requests wait
   * for it. A handler that throws keeps the reservation. Settled by `RateLimitInterceptor`, which
   * `@RateLimit` adds; outside HTTP, `RateLimiterService.settleCost`. Needs `maxCost`.
   */
  settleCost?: RateLimitSettleCost;
  /**
   * With `settleCost`: the most one request can really cost (an LLM call's `max_tokens`, an export's
   * page size), or a function of the request giving it (not for `consume`). Until it is settled, a request counts against the others at its most: one is
   * admitted only while the budget holds it and every request still in flight at their most. So
   * requests running together never pass the budget by more than one request's overdraft (the
   * most less the reservation), and one alone spends the budget by its estimate.
   */
  maxCost?: RateLimitCost;
}

/** What a request really cost, from its handler's result (a whole number >= 0). */
export type RateLimitSettleCost = (result: unknown, context: ExecutionContext) => number | Promise<number>;

/** Whether a rule rejects (`'enforce'`), only reports what it would reject (`'shadow'`), or is skipped (`'off'`). */
export type RateLimitMode = 'enforce' | 'shadow' | 'off';
export const RATE_LIMIT_MODES: readonly RateLimitMode[] = ['enforce', 'shadow', 'off'];

export type RateLimitCountOn = 'all' | 'success' | 'failure';
const COUNT_ON: readonly RateLimitCountOn[] = ['all', 'success', 'failure'];

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

import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';
import type { AllowList } from './allow-list.js';
import type { RateLimitMode, RateLimitOptions } from './rule-options.js';

/**
 * A rule after validation at bootstrap, as the guard uses it on every request. Its members' types
 * are written through `RateLimitOptions`, so that the package names no type for each of them.
 */
export interface RateLimitRule {
  readonly name: string;
  /** The rule in its keys (`ruleKeyId` of the name): computed once here, not per request. */
  readonly keyId: string;
  /** Where it was declared, for messages: `Controller` or `Controller.method`. */
  readonly declaredOn: string;
  readonly count: number;
  readonly windowMs: number;
  readonly configKey: string | undefined;
  readonly by: NonNullable<RateLimitOptions['by']>;
  readonly algorithm: RateLimitAlgorithmName;
  /** Explicit burst; without it, the (possibly overridden) count. */
  readonly burst: number | undefined;
  readonly cost: NonNullable<RateLimitOptions['cost']>;
  /** 0 (the default, without `blockFor`): no penalty. */
  readonly blockMs: number;
  readonly countOn: NonNullable<RateLimitOptions['countOn']>;
  /** `undefined`: the module's policy. */
  readonly onStoreError: RateLimitStoreErrorPolicy | undefined;
  /** Units an instance takes from a shared store at once; 0: none, every request asks. */
  readonly lease: number;
  /** `undefined`: the module's mode. */
  readonly mode: RateLimitMode | undefined;
  readonly skipIf: RateLimitOptions['skipIf'];
  /** @internal The rule's `allow`, made ready for requests. */
  readonly allow: AllowList | undefined;
  /** Per tier name, the rule with that tier's thresholds (same name, key id and counters). */
  readonly tiers: ReadonlyMap<string, RateLimitRule> | undefined;
  /** @internal The option's `tiers.of`: which of `tiers` a request is counted under. */
  readonly tier: NonNullable<RateLimitOptions['tiers']>['of'] | undefined;
  /** @internal The option's `settleCost.actual`: what a request really cost, from its handler's result. */
  readonly settleCost: NonNullable<RateLimitOptions['settleCost']>['actual'] | undefined;
  /** @internal The option's `settleCost.max`: the most one request can cost; undefined without `settleCost`. */
  readonly maxCost: NonNullable<RateLimitOptions['settleCost']>['max'] | undefined;
  /**
   * A cap on requests in flight (`count` slots, counted as a sliding log of `SLOT_LEASE_MS`, each
   * admission given back when its request ends); undefined for a rate.
   */
  readonly concurrency?: number;
  /** How long, and how many, of its requests may wait for room; undefined: refused at once. */
  readonly wait?: { readonly maxMs: number; readonly maxQueued: number };
  /** A share of the limit whose crossing is reported; undefined: none. */
  readonly nearLimit: number | undefined;
  /** Set for the rule of one of another rule's `tiers`: that tier's name. */
  readonly tierName?: string;
  /** Set for a rule of the module's `defaults`, as applied to a handler. */
  readonly fromDefaults?: true;
  /**
   * Whether `RateLimitInterceptor` decides the rule, after the app's guards, instead of
   * `RateLimitGuard` before them: on HTTP, and on GraphQL and WebSocket (`elsewhere`).
   * - It reads the request through a function of the app's (`by`, `tiers.of`, `skipIf`), which may
   *   read what an authentication guard sets (`req.user`).
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

/** How `validateRule` reports a field that cannot work: it throws, naming the rule and the field. */
export type Fail = (field: string, problem: string, value: unknown) => never;

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
  if (rule.concurrency !== undefined) {
    // A cap's slots, which a config centre's `count` sets; it has no window of its own.
    options.concurrency = rule.count;
    delete options.count;
    delete options.window;
    delete options.algorithm;
  }
  if (rule.wait !== undefined) options.wait = { ...rule.wait };
  if (rule.configKey !== undefined) options.configKey = rule.configKey;
  if (rule.burst !== undefined) options.burst = rule.burst;
  if (rule.blockMs > 0) options.blockFor = rule.blockMs;
  if (rule.onStoreError !== undefined) options.onStoreError = rule.onStoreError;
  if (rule.lease > 0) options.lease = rule.lease;
  if (rule.mode !== undefined) options.mode = rule.mode;
  if (rule.skipIf !== undefined) options.skipIf = rule.skipIf;
  if (rule.allow !== undefined) options.allow = rule.allow.source;
  if (rule.nearLimit !== undefined) options.nearLimit = rule.nearLimit;
  if (rule.settleCost !== undefined) options.settleCost = { actual: rule.settleCost, max: rule.maxCost! };
  return options;
}

// The options of a rule, as `@RateLimit`, the module's `defaults` and the limiter's API take them.
// Their members' types are written out here, not named: `RateLimitOptions['by']` names one.
import type { ExecutionContext } from '@nestjs/common';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';
import type { RateLimitAllowList } from './allow-list.js';

/** What `@RateLimit()` takes. */
export interface RateLimitOptions {
  /**
   * Requests admitted per window: a positive whole number. With `tiers`: the limit of a request
   * whose tier is none of `tiers.limits`. Required, with `window`, unless the rule is a `concurrency` cap.
   */
  count?: number;
  /**
   * Window length: whole milliseconds, or a duration string (`'500ms'`, `'1s'`, `'1.5m'`, `'1h'`,
   * `'1d'`), at most 365 days. A string of digits alone is milliseconds, as env files give them.
   */
  window?: number | string;
  /**
   * A cap on requests in flight instead of a rate: at most this many of the rule's requests (per
   * `by` identity) run at once, across instances. A slot is taken before the handler and given back
   * when the request ends in any way; a crashed instance's slots come back within 30 s. A positive
   * whole number up to 10,000; the rule then takes no `count`, `window`, `algorithm`, `burst`,
   * `blockFor`, `countOn`, `lease`, `tiers` or `settleCost`. Its `configKey`'s `count` sets the cap live.
   */
  concurrency?: number;
  /**
   * Lets a request past the limit wait for room instead of being refused: up to `maxMs` (ms or a
   * duration, at most the rule's window, or a minute for a shorter window), admitted in arrival order per
   * key within an instance as soon as the rule has room. At most `maxQueued` (default 100, at most
   * 10,000) wait per key and instance; one that would wait longer than `maxMs`, as the store's answer
   * tells in advance, or finds the queue full, is refused at once. Not with `blockFor` or `lease`.
   */
  wait?: { maxMs: number | string; maxQueued?: number };
  /** Key in the config centre whose `count` / `window` override the values above at run time. */
  configKey?: string;
  /**
   * Who shares a counter: `'ip'` (default: the client address as the HTTP adapter reports it,
   * honouring the app's trust-proxy setting), `'global'` (one counter for the rule), or a function
   * of the context giving an identity (a user id, an API key, a tenant). The function runs after
   * the app's guards, so it can read what an authentication guard set (`req.user?.id`). Requests it
   * gives no identity (`undefined`, `null`, `''`) share one anonymous counter; throw an
   * `HttpException` (e.g. `BadRequestException`) to refuse them instead.
   */
  by?:
    | 'ip'
    | 'global'
    | ((context: ExecutionContext) => string | number | null | undefined | Promise<string | number | null | undefined>);
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
  /** Units a request consumes: a number, or a function of the context (e.g. upload size in MB). Default 1. */
  cost?: number | ((context: ExecutionContext) => number | Promise<number>);
  /** Once the rule rejects an identity, keep rejecting it for this long (a penalty), as `window` is written. */
  blockFor?: number | string;
  /**
   * Which requests stay counted: `'all'` (default), `'success'` (the response's status is below
   * 400) or `'failure'` (400 or above, or the response never finished: a thrown handler, a timeout,
   * a broken stream). The others are refunded when the response ends. On a GraphQL operation or a
   * WebSocket message, the handler decides: its result is a success, its error a failure.
   */
  countOn?: 'all' | 'success' | 'failure';
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
  /**
   * Requests this rule does not count (nor sends headers for): a function of the context. It runs
   * after the app's guards, as `by` does. One that throws or rejects skips nothing: the request is
   * decided as if it were not there (the error is logged by sampling).
   */
  skipIf?: (context: ExecutionContext) => boolean | Promise<boolean>;
  /**
   * Requests this rule does not count, by address, identity or user agent. A config centre's
   * `allow` for the rule's `configKey` replaces it while the app runs.
   */
  allow?: RateLimitAllowList;
  /**
   * Limits per plan, each request counted under the tier `of` names. A request of no tier (or of
   * one not in `limits`, said once) gets `count` and `window`. Tiers count on one counter per
   * identity: an identity that changes plan keeps what it used. With a `configKey`, tier `pro` reads
   * its live values from `<configKey>.pro`.
   *
   * @example tiers: { of: (ctx) => ctx.switchToHttp().getRequest().user?.plan, limits: { pro: 5000, partner: { count: 20000, window: '1m' } } }
   */
  tiers?: {
    /**
     * The tier a request is counted under: a name of `limits`, or none (`undefined`, `null`, `''`).
     * It runs after the app's guards, as `by` does.
     */
    of: (context: ExecutionContext) => string | null | undefined | Promise<string | null | undefined>;
    /** Each tier's limit: a count per the rule's window, or its own `count`, `window` and `burst`. */
    limits: Readonly<Record<string, number | { count: number; window?: number | string; burst?: number }>>;
  };
  /**
   * A share of the limit (above 0, below 1; `0.8`: 80%): the admission that takes an identity's use
   * to it or past it is counted in the metrics (`near_limit_total`) and given to the module's
   * `onNearLimit`, so an app can warn a customer before the 429. Once per crossing, not per request.
   */
  nearLimit?: number;
  /**
   * For a request whose real cost is known only after its handler (tokens an LLM call used, rows
   * exported): `cost` is then what is reserved up front (an estimate); after the handler the
   * difference is refunded or charged, in one store call. An overdraft is charged in full, past the
   * limit if need be, so the identity's next requests wait for it. A handler that throws keeps the
   * reservation. Settled by `RateLimitInterceptor`, which the module puts on the route; outside
   * HTTP, `RateLimiterService.settleCost`.
   *
   * @example settleCost: { actual: (result: Completion) => result.usage.totalTokens, max: 4_000 }
   */
  settleCost?: {
    /** What the request really cost, from its handler's result: a whole number, 0 or more. */
    actual: (result: unknown, context: ExecutionContext) => number | Promise<number>;
    /**
     * The most one request can really cost (an LLM call's `max_tokens`, an export's page size), or a
     * function of the request giving it (not for `consume`). Until it is settled, a request counts
     * against the others at its most: one is admitted only while the budget holds it and every
     * request still in flight at their most. So requests running together never pass the budget by
     * more than one request's overdraft (the most less the reservation), and one alone spends the
     * budget by its estimate.
     */
    max: number | ((context: ExecutionContext) => number | Promise<number>);
  };
}

/** Whether a rule rejects (`'enforce'`), only reports what it would reject (`'shadow'`), or is skipped (`'off'`). */
export type RateLimitMode = 'enforce' | 'shadow' | 'off';
export const RATE_LIMIT_MODES: readonly RateLimitMode[] = ['enforce', 'shadow', 'off'];

/*
 * The members' types by the names the library's code uses. Not exported by the package: users name
 * them through the options (`RateLimitOptions['by']`), and the package's own signatures do too.
 */
export type RateLimitBy = NonNullable<RateLimitOptions['by']>;
export type RateLimitCost = NonNullable<RateLimitOptions['cost']>;
export type RateLimitCountOn = NonNullable<RateLimitOptions['countOn']>;
export type RateLimitSkipIf = NonNullable<RateLimitOptions['skipIf']>;
export type RateLimitTiers = NonNullable<RateLimitOptions['tiers']>;
export type RateLimitTierResolver = RateLimitTiers['of'];
/** What a request really cost, from its handler's result (`settleCost.actual`). */
export type RateLimitSettleCost = NonNullable<RateLimitOptions['settleCost']>['actual'];

export const COUNT_ON: readonly RateLimitCountOn[] = ['all', 'success', 'failure'];

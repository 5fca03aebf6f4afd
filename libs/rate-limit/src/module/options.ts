import type { ConfigurableModuleAsyncOptions, Type } from '@nestjs/common';
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from 'ioredis';
import type { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import type { RateLimitHeaderStyle, RateLimitNearLimitEvent } from '../limiter/rate-limit-outcome.js';
import type { SampledLogLevel } from '../logging/sampled-logger.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';
import type { RateLimitStore } from '../store/rate-limit-store.js';
import type { RateLimitMode, RateLimitOptions } from '../rules/rate-limit-rule.js';
import type { AllowList, RateLimitAllowList } from '../rules/allow-list.js';
import type { RateLimitExtension } from './extension.js';

export type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';

/**
 * How to reach Redis:
 * - a URL: `'redis://:password@host:6379/0'`;
 * - ioredis options, optionally with `url`: `{ url, connectTimeout: 2000 }`, `{ host, port }`;
 * - a Cluster: `{ cluster: [{ host, port }, ...], options?: ClusterOptions }`;
 * - your own client: `{ client }`. The library then never closes it and defines no commands on it.
 */
export type RateLimitRedisOptions =
  | string
  | { client: Redis | Cluster }
  | { cluster: ClusterNode[]; options?: ClusterOptions }
  | (RedisOptions & { url?: string });

/**
 * The circuit breaker's settings, as the Redis connection builds its breaker with them: the
 * `storeErrors.circuitBreaker` options, and the share of failed calls that opens it
 * (`CIRCUIT_BREAKER_SHARE` in `defaults.ts`, no option).
 */
export interface RateLimitCircuitBreakerOptions {
  /** Open when at least this share of calls in the window failed or timed out. */
  failureRatio?: number;
  /** ...counting only windows with at least this many calls. */
  minimumCalls?: number;
  /** The window the share is taken over. */
  windowMs?: number;
  /** Open after this many failures in a row, whatever the share. */
  consecutiveFailures?: number;
  /** Let one probe call through this long after opening; its success closes the circuit. */
  halfOpenAfterMs?: number;
}

/** What happens when the store (Redis) fails, is too slow, or the circuit is open. */
export interface RateLimitStoreErrorOptions {
  /**
   * What a request gets then: `'local'` (default; this instance decides from what Redis last
   * reported, pessimistically), `'allow'` (admitted) or `'deny'` (refused with `status` and
   * `Retry-After: 1`). A rule's own `onStoreError` wins over this.
   */
  policy?: RateLimitStoreErrorPolicy;
  /**
   * Deadline for one Redis call, in ms: past it, the request is decided by `policy` (Redis's late
   * answer, if one comes, still tells the `'local'` fallback the counts). Default 100.
   */
  timeoutMs?: number;
  /**
   * When to stop calling a failing Redis, or `false` to always call it. It also opens when 30% of
   * the calls of the last 10 s failed, counting only 20 calls or more (`CIRCUIT_BREAKER_SHARE`).
   */
  circuitBreaker?:
    | {
        /** Open after this many failures in a row. Default 5. */
        consecutiveFailures?: number;
        /** Let one probe call through this long after opening; its success closes the circuit. Default 250 ms. */
        halfOpenAfterMs?: number;
      }
    | false;
  /** The `'local'` fallback. */
  localFallback?: {
    /**
     * The instances assumed to share Redis until they are counted on it (`PUBSUB NUMSUB`, every 5 s,
     * where the ACL allows): each takes its part of `count / instances`, rounded up where all
     * together stay within 1.05x, else down. Default 2.
     */
    expectedInstances?: number;
  };
  /** Status of requests refused by `'deny'`: 429 (default) or 503. */
  status?: 429 | 503;
}

/** Defences against a Redis failover losing recent writes (Standalone with replicas, Sentinel). */
export interface RateLimitFailoverOptions {
  /**
   * Fixed-window rules counting every request: when Redis reports a clearly lower count for a window
   * than this instance saw in it, decide on the higher figure and raise the counter to it.
   * Default `'auto'`: on where a replica can be promoted (Sentinel, Cluster, or a server that reports
   * connected replicas: asked at the start, on each reconnect and every 10 s until one is seen), off
   * on a lone server, where no failover can lose a write and the check costs nothing. `true`/`false`:
   * always on, or never.
   */
  detectLostWrites?: boolean | 'auto';
  /**
   * Fixed-window rules: once a window's count reaches this share of the limit, also keep it in a
   * marker key (as long as the counter); a counter that goes while its marker stays (deleted,
   * evicted) resumes from it. A failover loses both or neither, so there it adds nothing to
   * `detectLostWrites` (measured: docs/failure-modes.md, "The marker"). Default `false`: none.
   */
  marker?: number | false;
  /**
   * Wait, after each admitted request, until this many replicas have its counts (Redis `WAIT`).
   * Standalone and Sentinel only. Default off.
   */
  waitForReplicas?: { replicas?: number; timeoutMs?: number } | false;
}

/**
 * Rejection log lines. They are sampled: at most one per rule and identity per 10 s, and 5 a second
 * in all, each counting the rejections since the last (`LOG_SAMPLING` in `defaults.ts`).
 */
export interface RateLimitLoggingOptions {
  /** Level of rejection lines. Default `'warn'`. */
  level?: SampledLogLevel;
}

export interface RateLimitModuleOptions {
  // Where counters live.
  /** Redis connection. Without it (and without `store`) counters live in this process. */
  redis?: RateLimitRedisOptions;
  /**
   * A store of your own, extending `RateLimitStore` and keeping its contract: an instance, or a
   * class created with dependency injection. Wins over `redis` and the in-process store.
   */
  store?: RateLimitStore | Type<RateLimitStore>;
  /** The in-process store (no Redis): keys held at most, least recently used evicted first. Default 10,000. */
  memoryStore?: { maxKeys?: number };
  /** Prefix of every key the library writes. Default `'rl'`. */
  keyPrefix?: string;
  /**
   * A shared store (Redis): keys it refused until the reset it reported (a full window, a
   * `blockFor` penalty) are refused here without asking it again (10,000 keys at most, least
   * recently used forgotten first). A reset through `RateLimiterService.reset` on any instance, a
   * refund and a changed limit lift such a block at once. Not for `countOn` rules, whose counts fall
   * when units are refunded. Default true; `false`: ask the store every time.
   */
  blockCache?: boolean;

  // Failure policy and failover tuning.
  storeErrors?: RateLimitStoreErrorOptions;
  failover?: RateLimitFailoverOptions;
  /**
   * Rules with `countOn`: a request refused only because of admissions still in flight (their units
   * may yet be refunded) waits up to `inFlightWaitMs` for them to settle and is then decided again;
   * past it, it gets a 429 that starts no `blockFor` penalty. 0: refuse at once. Default 1,000.
   */
  countOn?: { inFlightWaitMs?: number };

  // What clients and operators see.
  /**
   * Rate-limit headers:
   * - `'draft-6'` (default): `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of the
   *   tightest rule, as draft-ietf-httpapi-ratelimit-headers-06 and earlier name them, and as most
   *   clients read them today;
   * - `'draft-11'`: the current draft's structured fields, one item per rule, named after it:
   *   `RateLimit-Policy: "orders";q=100;w=60` and `RateLimit: "orders";r=97;t=42`;
   * - `'x-ratelimit'`: `X-RateLimit-Limit`, `-Remaining` and `-Reset`, the names
   *   `@nestjs/throttler` sends, for clients migrating from it;
   * - `false`: none.
   * Whatever the style, a rejected request carries `Retry-After`.
   */
  headers?: 'draft-6' | 'draft-11' | 'x-ratelimit' | false;
  /** Sampling of rejection log lines, or `false` for none. */
  logging?: RateLimitLoggingOptions | false;

  // Requests let through.
  /**
   * Requests no rule counts (and that get no rate-limit headers): from these addresses or networks,
   * with these user agents, or (per rule) counted under these identities. `configKey`: a config
   * centre key whose `allow` values replace these while the app runs (`RedisConfigCentre`: written
   * with `RateLimitManagementService.set` or the CLI, on every instance at once).
   */
  allow?: RateLimitAllowList & { configKey?: string };
  /**
   * Requests no rule counts: a function of the context, run where the request's rules are decided.
   * One that throws or rejects skips nothing (the request is decided as usual; the error is logged
   * by sampling).
   */
  skipIf?: RateLimitOptions['skipIf'];

  // What clients and operators see (continued).
  /**
   * Called when an admission takes an identity's use of a rule to the rule's `nearLimit` share (once
   * per crossing): to warn a customer before the 429. Not awaited; one that throws is logged by
   * sampling and the request goes on.
   */
  onNearLimit?: (event: RateLimitNearLimitEvent) => void | Promise<void>;
  /**
   * Identities banned while the app runs (`RateLimitManagementService.ban`, the CLI): refused with
   * `status`, 403 (default) or 429, and `Retry-After` until the ban ends.
   */
  bans?: { status?: 403 | 429 };

  // Inputs.
  /** Where run-time thresholds come from. Default: `@nestjs/config`'s `ConfigService` (see `NestConfigCentre`). */
  configCentre?: Type<RateLimitConfigCentre> | RateLimitConfigCentre;
  /** `RedisConfigCentre`: besides its pub/sub news, it reads every value again this often, in ms. Default 5,000. */
  liveConfig?: { refreshMs?: number };
  /**
   * The mode of every rule that names none: `'enforce'` (default), `'shadow'` (count and decide,
   * never reject: to try the limiter on real traffic first) or `'off'`. A rule's `mode` wins, and
   * a config centre's `mode` for its `configKey` wins over both.
   */
  mode?: RateLimitMode;
  /** `by: 'ip'` counts IPv6 clients per prefix of this many bits. Default 64. */
  ipv6PrefixBits?: number;
  /**
   * The time in ms, when the application's clock should decide instead of the store's (Redis
   * `TIME`, which keeps app servers with skewed clocks in agreement). Tests pass a fake clock.
   */
  clock?: () => number;
}

/** Options of `forRoot`/`forRootAsync` that shape the module itself, so they cannot come from a factory. */
export interface RateLimitModuleExtras {
  /** Make the module's providers visible to every module. Default false. */
  isGlobal?: boolean;
  /**
   * Register `RateLimitGuard` for every route (`APP_GUARD`). Default true. With false, apply it
   * yourself with `@UseGuards(RateLimitGuard)`.
   */
  globalGuard?: boolean;
  /**
   * Rules of every handler the guard limits (HTTP routes, GraphQL queries and mutations, gateway
   * messages), as `@nestjs/throttler`'s `forRoot([{ ttl, limit }])`: a decorator rule of the same
   * name replaces one on its routes, `@SkipRateLimit()` skips all, `@SkipRateLimit('name')` one.
   * Each counts per route unless its `scope` is `'app'`. Checked at bootstrap; the startup log says
   * how many handlers each covers.
   *
   * @example defaults: [{ count: 100, window: '1m' }]   // 100 per minute per client IP, on every route
   */
  defaults?: readonly (RateLimitOptions & {
    /**
     * `'route'` (default, as `@nestjs/throttler` counts): each handler counts on a counter of its
     * own; `'app'`: one counter per identity for every handler the rule covers.
     */
    scope?: 'route' | 'app';
  })[];
  /**
   * Parts added to the module, each from the entry that ships it (`RateLimitExtension`): live
   * limits' management from `nest-rate-limit/live`, metrics, health and the key audit from
   * `nest-rate-limit/ops`. Default none: the module makes none of them.
   *
   * @example extensions: [rateLimitManagement(), rateLimitMetrics(), rateLimitHealth()]
   */
  extensions?: readonly RateLimitExtension[];
}

/** `forRootAsync`'s options: `useFactory` (with `inject`, `imports`), `useClass` or `useExisting`, and the extras. */
export type RateLimitModuleAsyncOptions = ConfigurableModuleAsyncOptions<RateLimitModuleOptions, 'create'> &
  RateLimitModuleExtras;

/**
 * Module options after defaults and checks; what the services use. Besides the options, it carries
 * the constants of `defaults.ts` the services are built with (the block cache's size, the fallback's
 * safety factor, the log sampling, the audit's period), so each service reads one object.
 */
export interface ResolvedRateLimitOptions {
  /** `redis` as given, once checked: how `RedisService` connects. */
  redis: RateLimitRedisOptions | undefined;
  /** `store` as given: the module's store is made from it. */
  store: RateLimitModuleOptions['store'];
  /** `configCentre` as given: the module's config centre is made from it. */
  configCentre: RateLimitModuleOptions['configCentre'];
  keyPrefix: string;
  memoryStore: { maxKeys: number };
  blockCache: { maxKeys: number } | false;
  storeErrors: {
    policy: RateLimitStoreErrorPolicy;
    timeoutMs: number;
    circuitBreaker: Required<RateLimitCircuitBreakerOptions> | false;
    localFallback: { expectedInstances: number };
    status: 429 | 503;
  };
  failover: {
    /** `'auto'`: on once a replica can be promoted (`redis/failover/lost-write-check-switch.ts`). */
    detectLostWrites: boolean | 'auto';
    marker: number | false;
    waitForReplicas: { replicas: number; timeoutMs: number } | false;
  };
  countOn: { inFlightWaitMs: number };
  headers: RateLimitHeaderStyle;
  logging: { intervalMs: number; maxLinesPerSecond: number; level: SampledLogLevel } | false;
  mode: RateLimitMode;
  liveConfig: { refreshMs: number };
  keyAudit: { intervalMs: number };
  ipv6PrefixBits: number;
  clock: (() => number) | undefined;
  /** The module-wide `allow` list, if any, and its config key. */
  allow: { list: AllowList | undefined; configKey: string | undefined } | undefined;
  skipIf: RateLimitOptions['skipIf'];
  onNearLimit: ((event: RateLimitNearLimitEvent) => void | Promise<void>) | undefined;
  bans: { status: 403 | 429 };
}

/** Injection token of the `ResolvedRateLimitOptions` (internal). */
export const RESOLVED_RATE_LIMIT_OPTIONS = Symbol('RESOLVED_RATE_LIMIT_OPTIONS');

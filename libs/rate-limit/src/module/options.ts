import type { Type } from '@nestjs/common';
import type { Cluster, ClusterNode, ClusterOptions, Redis, RedisOptions } from 'ioredis';
import type { RateLimitConfigCentre } from '../config-centre/rate-limit-config-centre.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { HEADER_STYLES, type RateLimitHeaderStyle } from '../http/rate-limit-headers.js';
import type { SampledLogLevel } from '../logging/sampled-logger.js';
import type { RateLimitCircuitBreakerOptions } from '../redis/redis-circuit-breaker.js';
import {
  DEFAULT_IN_FLIGHT_WAIT_MS,
  DEFAULT_KEY_PREFIX,
  DEFAULT_LOG_INTERVAL_MS,
  DEFAULT_LOG_MAX_LINES_PER_SECOND,
  DEFAULT_MEMORY_MAX_KEYS,
  DEFAULT_REDIS_TIMEOUT_MS,
} from '../decorators/metadata-keys.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { type RateLimitStoreErrorPolicy, STORE_ERROR_POLICIES } from '../resilience/store-error-policy.js';

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

export interface RateLimitLoggingOptions {
  /** At most one rejection line per rule and identity per interval. Default 10 s. */
  intervalMs?: number;
  /** At most this many rejection lines per second in all. Default 5. */
  maxLinesPerSecond?: number;
  /** Level of rejection lines. Default `'warn'`. */
  level?: SampledLogLevel;
}

export interface RateLimitModuleOptions {
  /** Redis connection. Without it the library uses an in-process store (not shared across instances). */
  redis?: RateLimitRedisOptions;
  /**
   * A store of your own, extending `RateLimitStore` and keeping its contract (every rule of a
   * request admitted together or not at all; settles; records): an instance, or a class created
   * with dependency injection. Wins over `redis` and the in-process store.
   */
  store?: RateLimitStore | Type<RateLimitStore>;
  /** Prefix of every key the library writes. Default `'rl'`. */
  keyPrefix?: string;
  /** Deadline for one Redis call, in ms; past it the request is decided by `onStoreError`. Default 100. */
  redisTimeoutMs?: number;
  /**
   * What a request gets when Redis fails, misses its deadline or the circuit is open: `'local'`
   * (default; this instance decides from what Redis last reported, pessimistically), `'allow'`
   * (admitted) or `'deny'` (refused with `storeErrorStatus` and `Retry-After: 1`). A rule's own
   * `onStoreError` wins over this.
   */
  onStoreError?: RateLimitStoreErrorPolicy;
  /** `'local'` fallback tuning. */
  localFallback?: { safetyFactor?: number; expectedInstances?: number };
  /** Status of requests refused by `onStoreError: 'deny'`: 429 (default) or 503. */
  storeErrorStatus?: 429 | 503;
  /** Where run-time thresholds come from. Default: `@nestjs/config`'s `ConfigService` (see `NestConfigCentre`). */
  configCentre?: Type<RateLimitConfigCentre> | RateLimitConfigCentre;
  /**
   * Rate-limit headers on responses: `'draft-6'` (default: `RateLimit-Limit`, `-Remaining`, `-Reset`
   * of the tightest rule), `'draft-11'` (`RateLimit-Policy` and `RateLimit` structured fields, one
   * item per rule), `'x-ratelimit'` (`@nestjs/throttler`'s `X-RateLimit-*` names) or `false`.
   * Rejections carry `Retry-After` whatever the style.
   */
  headers?: RateLimitHeaderStyle;
  /** Sampling of rejection log lines, or `false` for none. */
  logging?: RateLimitLoggingOptions | false;
  /** Keys the in-process store holds at most (least recently used evicted first). Default 10,000. */
  memoryStoreMaxKeys?: number;
  /**
   * The time in ms, when the application's clock should decide instead of the store's (Redis
   * `TIME`, which keeps app servers with skewed clocks in agreement). Tests pass a fake clock.
   */
  clock?: () => number;
  /** `by: 'ip'` counts IPv6 clients per prefix of this many bits. Default 64. */
  ipv6PrefixBits?: number;
  /** When to stop calling a failing Redis (defaults below), or `false` to always call it. */
  circuitBreaker?: RateLimitCircuitBreakerOptions | false;
  /**
   * Fixed-window rules counting every request: when Redis reports a clearly lower count for a window
   * than this instance saw in it (writes lost in a failover), decide on the higher figure and raise
   * the counter in Redis to it. Default true.
   */
  detectLostWrites?: boolean;
  /**
   * Wait, after each admitted request, until this many replicas have its counts (Redis `WAIT`), for
   * those who prefer latency to any loss in a failover. Standalone and Sentinel only. Default off.
   */
  waitForReplicas?: { replicas?: number; timeoutMs?: number } | false;
  /**
   * Fixed-window rules: once a window's count reaches this share of the limit, also keep it in a
   * marker key (two windows long); a counter a failover lost resumes from the marker. Default 0.8;
   * `false` for none.
   */
  lostWriteMarker?: number | false;
  /**
   * Rules with `countOn`: a request refused only because of admissions still in flight (their units
   * may yet be refunded) waits up to this long, in ms, for them to settle and is then decided again;
   * past it, it gets a 429 that starts no `blockFor` penalty. 0: refuse at once. Default 5,000.
   */
  inFlightWaitMs?: number;
}

/** Options of `forRoot`/`forRootAsync` that shape the module itself, so they cannot come from a factory. */
export interface RateLimitModuleExtras {
  /** Make the module's providers visible to every module. Default false. */
  isGlobal?: boolean;
  /**
   * Register `RateLimitGuard` and `RateLimitInterceptor` for every route (`APP_GUARD`/`APP_INTERCEPTOR`).
   * Default true. With false, apply them yourself with `@UseGuards`/`@UseInterceptors`.
   */
  globalGuard?: boolean;
}

/** Module options after defaults and checks; what the services use. */
export interface ResolvedRateLimitOptions {
  keyPrefix: string;
  redisTimeoutMs: number;
  onStoreError: RateLimitStoreErrorPolicy;
  localFallback: { safetyFactor: number; expectedInstances: number };
  storeErrorStatus: 429 | 503;
  headers: RateLimitHeaderStyle;
  logging: Required<RateLimitLoggingOptions> | false;
  memoryStoreMaxKeys: number;
  clock: (() => number) | undefined;
  ipv6PrefixBits: number;
  circuitBreaker: Required<RateLimitCircuitBreakerOptions> | false;
  detectLostWrites: boolean;
  waitForReplicas: { replicas: number; timeoutMs: number } | false;
  lostWriteMarker: number | false;
  inFlightWaitMs: number;
}

const KEY_PREFIX = /^[A-Za-z0-9._:-]{1,32}$/;
const LEVELS: readonly SampledLogLevel[] = ['error', 'warn', 'log', 'debug', 'verbose'];

/** Applies defaults and rejects values that cannot work, naming the field. */
export function resolveModuleOptions(options: RateLimitModuleOptions = {}): ResolvedRateLimitOptions {
  const fail = (field: string, problem: string, value: unknown): never => {
    throw new RateLimitConfigurationError(
      `RateLimitModule options: '${field}' ${problem}, got ${JSON.stringify(value)}`,
    );
  };
  const positive = (field: string, value: number | undefined, fallback: number): number => {
    if (value === undefined) return fallback;
    return Number.isSafeInteger(value) && value > 0 ? value : fail(field, 'must be a positive whole number', value);
  };
  const { store } = options;
  if (
    store !== undefined &&
    !(store instanceof RateLimitStore) &&
    !(typeof store === 'function' && store.prototype instanceof RateLimitStore)
  ) {
    fail('store', 'must be an instance of a class extending RateLimitStore, or such a class', typeof store);
  }
  const keyPrefix = options.keyPrefix ?? DEFAULT_KEY_PREFIX;
  if (typeof keyPrefix !== 'string' || !KEY_PREFIX.test(keyPrefix)) {
    fail('keyPrefix', 'must be 1 to 32 characters of letters, digits and . _ : -', keyPrefix);
  }
  const onStoreError = options.onStoreError ?? 'local';
  if (!STORE_ERROR_POLICIES.includes(onStoreError)) {
    fail('onStoreError', `must be one of ${STORE_ERROR_POLICIES.join(', ')}`, onStoreError);
  }
  const safetyFactor = options.localFallback?.safetyFactor ?? 1.2;
  if (typeof safetyFactor !== 'number' || !(safetyFactor >= 1)) {
    fail('localFallback.safetyFactor', 'must be a number of at least 1', safetyFactor);
  }
  const storeErrorStatus = options.storeErrorStatus ?? 429;
  if (storeErrorStatus !== 429 && storeErrorStatus !== 503)
    fail('storeErrorStatus', 'must be 429 or 503', storeErrorStatus);
  let logging: ResolvedRateLimitOptions['logging'] = false;
  if (options.logging !== false) {
    const given = options.logging ?? {};
    const level = given.level ?? 'warn';
    if (!LEVELS.includes(level)) fail('logging.level', `must be one of ${LEVELS.join(', ')}`, level);
    logging = {
      intervalMs: positive('logging.intervalMs', given.intervalMs, DEFAULT_LOG_INTERVAL_MS),
      maxLinesPerSecond: positive(
        'logging.maxLinesPerSecond',
        given.maxLinesPerSecond,
        DEFAULT_LOG_MAX_LINES_PER_SECOND,
      ),
      level,
    };
  }
  let circuitBreaker: ResolvedRateLimitOptions['circuitBreaker'] = false;
  if (options.circuitBreaker !== false) {
    const given = options.circuitBreaker ?? {};
    const ratio = given.failureRatio ?? 0.3;
    if (typeof ratio !== 'number' || !(ratio > 0 && ratio <= 1)) {
      fail('circuitBreaker.failureRatio', 'must be a number above 0 and at most 1', ratio);
    }
    circuitBreaker = {
      failureRatio: ratio,
      minimumCalls: positive('circuitBreaker.minimumCalls', given.minimumCalls, 20),
      windowMs: positive('circuitBreaker.windowMs', given.windowMs, 10_000),
      consecutiveFailures: positive('circuitBreaker.consecutiveFailures', given.consecutiveFailures, 5),
      halfOpenAfterMs: positive('circuitBreaker.halfOpenAfterMs', given.halfOpenAfterMs, 250),
    };
  }
  return {
    keyPrefix,
    circuitBreaker,
    detectLostWrites: options.detectLostWrites ?? true,
    lostWriteMarker:
      options.lostWriteMarker === false
        ? false
        : typeof (options.lostWriteMarker ?? 0.8) === 'number' &&
            (options.lostWriteMarker ?? 0.8) > 0 &&
            (options.lostWriteMarker ?? 0.8) <= 1
          ? (options.lostWriteMarker ?? 0.8)
          : fail('lostWriteMarker', 'must be a share above 0 and at most 1, or false', options.lostWriteMarker),
    waitForReplicas: options.waitForReplicas
      ? {
          replicas: positive('waitForReplicas.replicas', options.waitForReplicas.replicas, 1),
          timeoutMs: positive('waitForReplicas.timeoutMs', options.waitForReplicas.timeoutMs, 50),
        }
      : false,
    redisTimeoutMs: positive('redisTimeoutMs', options.redisTimeoutMs, DEFAULT_REDIS_TIMEOUT_MS),
    inFlightWaitMs:
      options.inFlightWaitMs === undefined ||
      (Number.isSafeInteger(options.inFlightWaitMs) && options.inFlightWaitMs >= 0)
        ? (options.inFlightWaitMs ?? DEFAULT_IN_FLIGHT_WAIT_MS)
        : fail('inFlightWaitMs', 'must be a whole number of ms, 0 or more', options.inFlightWaitMs),
    onStoreError,
    localFallback: {
      safetyFactor,
      expectedInstances: positive('localFallback.expectedInstances', options.localFallback?.expectedInstances, 2),
    },
    storeErrorStatus,
    headers: HEADER_STYLES.includes(options.headers ?? 'draft-6')
      ? (options.headers ?? 'draft-6')
      : fail('headers', `must be one of 'draft-6', 'draft-11', 'x-ratelimit' or false`, options.headers),
    logging,
    memoryStoreMaxKeys: positive('memoryStoreMaxKeys', options.memoryStoreMaxKeys, DEFAULT_MEMORY_MAX_KEYS),
    clock:
      options.clock === undefined || typeof options.clock === 'function'
        ? options.clock
        : fail('clock', 'must be a function returning ms', options.clock),
    ipv6PrefixBits:
      options.ipv6PrefixBits === undefined ||
      (Number.isInteger(options.ipv6PrefixBits) && options.ipv6PrefixBits >= 1 && options.ipv6PrefixBits <= 128)
        ? (options.ipv6PrefixBits ?? 64)
        : fail('ipv6PrefixBits', 'must be a whole number from 1 to 128', options.ipv6PrefixBits),
  };
}

/** Injection token of the `ResolvedRateLimitOptions` (internal). */
export const RESOLVED_RATE_LIMIT_OPTIONS = Symbol('RESOLVED_RATE_LIMIT_OPTIONS');

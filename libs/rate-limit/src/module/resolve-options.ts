import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { HEADER_STYLES } from '../limiter/rate-limit-outcome.js';
import type { SampledLogLevel } from '../logging/sampled-logger.js';
import { STORE_ERROR_POLICIES } from '../resilience/store-error-policy.js';
import { RATE_LIMIT_MODES, RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import {
  BLOCK_CACHE_MAX_KEYS,
  CIRCUIT_BREAKER_SHARE,
  KEY_AUDIT_INTERVAL_MS,
  LOCAL_FALLBACK_BOUND,
  LOG_SAMPLING,
  RATE_LIMIT_DEFAULTS as D,
  REPLICA_WAIT_DEFAULTS,
} from './defaults.js';
import type { RateLimitModuleOptions, ResolvedRateLimitOptions } from './options.js';
import { checkRedis, describe } from './check-redis-option.js';
import { AllowList } from '../rules/allow-list.js';

const KEY_PREFIX = /^[A-Za-z0-9._:-]{1,32}$/;
const MAX_TIMER_MS = 2 ** 31 - 1;
const LEVELS: readonly SampledLogLevel[] = ['error', 'warn', 'log', 'debug', 'verbose'];

/** The fields each group takes; any other is a mistake worth stopping for (a typo is silent otherwise). */
const FIELDS = {
  // prettier-ignore
  '': [
    'redis', 'store', 'memoryStore', 'blockCache', 'keyPrefix', 'storeErrors', 'failover', 'countOn',
    'headers', 'logging', 'configCentre', 'liveConfig', 'mode', 'ipv6PrefixBits', 'clock',
    'allow', 'skipIf', 'onNearLimit', 'bans', 'isGlobal', 'globalGuard', 'defaults', 'extensions',
  ],
  liveConfig: ['refreshMs'],
  memoryStore: ['maxKeys'],
  storeErrors: ['policy', 'timeoutMs', 'circuitBreaker', 'localFallback', 'status'],
  'storeErrors.circuitBreaker': ['consecutiveFailures', 'halfOpenAfterMs'],
  'storeErrors.localFallback': ['expectedInstances'],
  failover: ['detectLostWrites', 'marker', 'waitForReplicas'],
  'failover.waitForReplicas': ['replicas', 'timeoutMs'],
  countOn: ['inFlightWaitMs'],
  logging: ['level'],
  bans: ['status'],
} as const;

/** Options that a version fixed as constants (`defaults.ts`): since when, and what each now is, so an upgrade is told. */
const REMOVED: Record<string, string> = {
  'blockCache.maxKeys': `(0.3): the block cache holds ${BLOCK_CACHE_MAX_KEYS} keys; give blockCache: true or false`,
  'storeErrors.localFallback.safetyFactor': `(0.3): the instances together admit at most ${LOCAL_FALLBACK_BOUND}x the limit in a window the fallback decides`,
  'logging.intervalMs': `(0.3): rejection lines are sampled per ${LOG_SAMPLING.intervalMs} ms; only 'level' remains`,
  'logging.maxLinesPerSecond': `(0.3): at most ${LOG_SAMPLING.maxLinesPerSecond} rejection lines a second; only 'level' remains`,
  keyAudit: `(0.3): the background key audit runs every ${KEY_AUDIT_INTERVAL_MS} ms`,
  ...Object.fromEntries(
    Object.keys(CIRCUIT_BREAKER_SHARE).map((name) => [
      `storeErrors.circuitBreaker.${name}`,
      `(0.3): the circuit also opens when ${CIRCUIT_BREAKER_SHARE.failureRatio * 100}% of the calls of the last ${CIRCUIT_BREAKER_SHARE.windowMs / 1000} s failed, counting ${CIRCUIT_BREAKER_SHARE.minimumCalls} calls or more; consecutiveFailures and halfOpenAfterMs remain`,
    ]),
  ),
};

/** Options that became extensions (0.3), made only for an app that adds them. */
const EXTENSIONS: Record<string, string> = {
  metrics: "rateLimitMetrics({ registry, prefix }) from 'nest-rate-limit/ops'",
};

/** Where the flat options of 0.1 went, so an upgrade is told instead of silently ignored. */
const MOVED: Record<string, string> = {
  redisTimeoutMs: 'storeErrors.timeoutMs',
  onStoreError: 'storeErrors.policy',
  localFallback: 'storeErrors.localFallback',
  storeErrorStatus: 'storeErrors.status',
  circuitBreaker: 'storeErrors.circuitBreaker',
  memoryStoreMaxKeys: 'memoryStore.maxKeys',
  detectLostWrites: 'failover.detectLostWrites',
  lostWriteMarker: 'failover.marker',
  waitForReplicas: 'failover.waitForReplicas',
  inFlightWaitMs: 'countOn.inFlightWaitMs',
};

/**
 * Applies the defaults (`defaults.ts`) and rejects values that cannot work, naming the field.
 * @param fromFactory the value of `forRootAsync`'s factory, which cannot shape the module.
 */
export function resolveModuleOptions(
  options: RateLimitModuleOptions = {},
  fromFactory = false,
): ResolvedRateLimitOptions {
  const fail = (field: string, problem: string, ...value: [unknown?]): never => {
    const got = value.length > 0 ? `, got ${describe(value[0])}` : '';
    throw new RateLimitConfigurationError(`RateLimitModule options: '${field}' ${problem}${got}`);
  };
  const group = <T extends object>(field: keyof typeof FIELDS, value: T | undefined): Partial<T> => {
    if (value === undefined) return {};
    if (value === null || typeof value !== 'object') return fail(field, 'must be an object', value);
    for (const name of Object.keys(value)) {
      if (!(FIELDS[field] as readonly string[]).includes(name)) {
        const path = field ? `${field}.${name}` : name;
        // Own fields only: a field named `toString` is no option either.
        if (field === '' && Object.hasOwn(MOVED, name)) fail(path, `is now '${MOVED[name]}'`);
        if (field === '' && Object.hasOwn(EXTENSIONS, name)) {
          fail(path, `is now an extension: extensions: [${EXTENSIONS[name]}]`);
        }
        if (Object.hasOwn(REMOVED, path)) fail(path, `is no longer an option ${REMOVED[path]}`);
        fail(path, `is no option (known: ${FIELDS[field].join(', ')})`);
      }
    }
    return value;
  };
  const positive = (field: string, value: number | undefined, fallback: number): number => {
    if (value === undefined) return fallback;
    return Number.isSafeInteger(value) && value > 0 ? value : fail(field, 'must be a positive whole number', value);
  };
  // A timer's period: Node runs one longer than 2^31 - 1 ms every millisecond instead.
  const period = (field: string, value: number | undefined, fallback: number): number => {
    const ms = positive(field, value, fallback);
    return ms <= MAX_TIMER_MS ? ms : fail(field, `must be at most ${MAX_TIMER_MS} ms (about 24.8 days)`, value);
  };
  const oneOf = <T>(field: string, value: T | undefined, allowed: readonly T[], fallback: T): T => {
    if (value === undefined) return fallback;
    return allowed.includes(value) ? value : fail(field, `must be one of ${allowed.map(describe).join(', ')}`, value);
  };

  group('', options);
  if (fromFactory && (options as { defaults?: unknown }).defaults !== undefined) {
    fail(
      'defaults',
      "shapes the module (which routes are limited): give it to forRootAsync itself, beside 'useFactory'",
    );
  }
  const redis = checkRedis(options.redis, fail);
  const { store } = options;
  if (
    store !== undefined &&
    !(store instanceof RateLimitStore) &&
    !(typeof store === 'function' && store.prototype instanceof RateLimitStore)
  ) {
    fail('store', 'must be an instance of a class extending RateLimitStore, or such a class', typeof store);
  }
  const { configCentre } = options;
  if (
    configCentre !== undefined &&
    !(configCentre instanceof RateLimitConfigCentre) &&
    !(typeof configCentre === 'function' && configCentre.prototype instanceof RateLimitConfigCentre)
  ) {
    fail(
      'configCentre',
      'must be an instance of a class extending RateLimitConfigCentre, or such a class',
      typeof configCentre,
    );
  }
  const keyPrefix = options.keyPrefix ?? D.keyPrefix;
  if (typeof keyPrefix !== 'string' || !KEY_PREFIX.test(keyPrefix)) {
    fail('keyPrefix', 'must be 1 to 32 characters of letters, digits and . _ : -', keyPrefix);
  }

  const storeErrors = group('storeErrors', options.storeErrors);
  const localFallback = group('storeErrors.localFallback', storeErrors.localFallback);
  let circuitBreaker: ResolvedRateLimitOptions['storeErrors']['circuitBreaker'] = false;
  if (storeErrors.circuitBreaker !== false) {
    const given = group('storeErrors.circuitBreaker', storeErrors.circuitBreaker);
    const defaults = D.storeErrors.circuitBreaker;
    const field = (name: keyof typeof defaults) => `storeErrors.circuitBreaker.${name}`;
    circuitBreaker = {
      ...CIRCUIT_BREAKER_SHARE,
      consecutiveFailures: positive(
        field('consecutiveFailures'),
        given.consecutiveFailures,
        defaults.consecutiveFailures,
      ),
      halfOpenAfterMs: positive(field('halfOpenAfterMs'), given.halfOpenAfterMs, defaults.halfOpenAfterMs),
    };
  }

  const failover = group('failover', options.failover);
  const marker = failover.marker ?? D.failover.marker;
  if (marker !== false && !(typeof marker === 'number' && marker > 0 && marker <= 1)) {
    fail('failover.marker', 'must be a share above 0 and at most 1, or false', marker);
  }
  let waitForReplicas: ResolvedRateLimitOptions['failover']['waitForReplicas'] = false;
  if (failover.waitForReplicas !== undefined && failover.waitForReplicas !== false) {
    const given = group('failover.waitForReplicas', failover.waitForReplicas);
    waitForReplicas = {
      replicas: positive('failover.waitForReplicas.replicas', given.replicas, REPLICA_WAIT_DEFAULTS.replicas),
      timeoutMs: positive('failover.waitForReplicas.timeoutMs', given.timeoutMs, REPLICA_WAIT_DEFAULTS.timeoutMs),
    };
  }
  const detectLostWrites = failover.detectLostWrites ?? D.failover.detectLostWrites;
  if (typeof detectLostWrites !== 'boolean' && detectLostWrites !== 'auto')
    fail('failover.detectLostWrites', "must be true, false or 'auto'", detectLostWrites);

  const countOn = group('countOn', options.countOn);
  const inFlightWaitMs = countOn.inFlightWaitMs ?? D.countOn.inFlightWaitMs;
  if (!(Number.isSafeInteger(inFlightWaitMs) && inFlightWaitMs >= 0)) {
    fail('countOn.inFlightWaitMs', 'must be a whole number of ms, 0 or more', inFlightWaitMs);
  }

  let logging: ResolvedRateLimitOptions['logging'] = false;
  if (options.logging !== false) {
    const given = group('logging', options.logging);
    logging = { ...LOG_SAMPLING, level: oneOf('logging.level', given.level, LEVELS, D.logging.level) };
  }

  const liveConfig = group('liveConfig', options.liveConfig);
  const memoryStore = group('memoryStore', options.memoryStore);
  const { blockCache = D.blockCache } = options;
  if (typeof blockCache !== 'boolean') {
    const given: unknown = blockCache;
    if (given !== null && typeof given === 'object' && 'maxKeys' in given) {
      fail('blockCache.maxKeys', `is no longer an option ${REMOVED['blockCache.maxKeys']}`);
    }
    fail('blockCache', 'must be true or false', given);
  }
  const { ipv6PrefixBits = D.ipv6PrefixBits, clock } = options;
  if (!(Number.isInteger(ipv6PrefixBits) && ipv6PrefixBits >= 1 && ipv6PrefixBits <= 128)) {
    fail('ipv6PrefixBits', 'must be a whole number from 1 to 128', ipv6PrefixBits);
  }
  if (clock !== undefined && typeof clock !== 'function') fail('clock', 'must be a function returning ms', clock);
  const { skipIf } = options;
  if (skipIf !== undefined && typeof skipIf !== 'function') {
    fail('skipIf', 'must be a function of the ExecutionContext', skipIf);
  }
  const { onNearLimit } = options;
  if (onNearLimit !== undefined && typeof onNearLimit !== 'function') {
    fail('onNearLimit', 'must be a function of the event', onNearLimit);
  }
  let allow: ResolvedRateLimitOptions['allow'];
  if (options.allow !== undefined) {
    if (options.allow === null || typeof options.allow !== 'object') fail('allow', 'must be an object', options.allow);
    const { configKey, ...list } = options.allow;
    if (configKey !== undefined && (typeof configKey !== 'string' || configKey.trim() === '')) {
      fail('allow.configKey', 'must be a non-empty string', configKey);
    }
    const parsed = AllowList.parse(list);
    if (parsed.problems.length > 0) {
      throw new RateLimitConfigurationError(parsed.problems.map((problem) => `RateLimitModule options: ${problem}`));
    }
    if (parsed.list || configKey !== undefined) allow = { list: parsed.list, configKey };
  }

  return {
    redis,
    store,
    configCentre,
    keyPrefix,
    memoryStore: { maxKeys: positive('memoryStore.maxKeys', memoryStore.maxKeys, D.memoryStore.maxKeys) },
    blockCache: blockCache && { maxKeys: BLOCK_CACHE_MAX_KEYS },
    storeErrors: {
      policy: oneOf('storeErrors.policy', storeErrors.policy, STORE_ERROR_POLICIES, D.storeErrors.policy),
      timeoutMs: positive('storeErrors.timeoutMs', storeErrors.timeoutMs, D.storeErrors.timeoutMs),
      circuitBreaker,
      localFallback: {
        expectedInstances: positive(
          'storeErrors.localFallback.expectedInstances',
          localFallback.expectedInstances,
          D.storeErrors.localFallback.expectedInstances,
        ),
      },
      status: oneOf('storeErrors.status', storeErrors.status, [429, 503] as const, D.storeErrors.status),
    },
    failover: { detectLostWrites, marker, waitForReplicas },
    countOn: { inFlightWaitMs },
    headers: oneOf('headers', options.headers, HEADER_STYLES, D.headers),
    mode: oneOf('mode', options.mode, RATE_LIMIT_MODES, D.mode),
    liveConfig: { refreshMs: period('liveConfig.refreshMs', liveConfig.refreshMs, D.liveConfig.refreshMs) },
    keyAudit: { intervalMs: KEY_AUDIT_INTERVAL_MS },
    logging,
    ipv6PrefixBits,
    clock,
    allow,
    skipIf,
    onNearLimit,
    bans: { status: oneOf('bans.status', group('bans', options.bans).status, [403, 429] as const, 403) },
  };
}

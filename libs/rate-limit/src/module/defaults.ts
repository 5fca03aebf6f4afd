import type { ResolvedRateLimitOptions } from './options.js';

/**
 * Every default of the module's options, in one place. `resolveModuleOptions` applies them;
 * `docs/options.md` lists them.
 */
export const RATE_LIMIT_DEFAULTS = {
  keyPrefix: 'rl',
  memoryStore: { maxKeys: 10_000 },
  blockCache: { maxKeys: 10_000 },
  storeErrors: {
    policy: 'local',
    timeoutMs: 100,
    circuitBreaker: {
      failureRatio: 0.3,
      minimumCalls: 20,
      windowMs: 10_000,
      consecutiveFailures: 5,
      halfOpenAfterMs: 250,
    },
    localFallback: { safetyFactor: 1.2, expectedInstances: 2 },
    status: 429,
  },
  failover: {
    detectLostWrites: true,
    marker: 0.8,
    waitForReplicas: false,
  },
  countOn: { inFlightWaitMs: 5_000 },
  headers: 'draft-6',
  mode: 'enforce',
  liveConfig: { refreshMs: 5_000 },
  metrics: false,
  keyAudit: { intervalMs: 600_000 },
  logging: { intervalMs: 10_000, maxLinesPerSecond: 5, level: 'warn' },
  ipv6PrefixBits: 64,
} as const satisfies Omit<ResolvedRateLimitOptions, 'clock'>;

/** The prefix of every metric name, unless `metrics.prefix` says otherwise. */
export const METRICS_PREFIX = 'rate_limit_';

/** What `failover.waitForReplicas` waits for when it is given without them (it is off by default). */
export const REPLICA_WAIT_DEFAULTS = { replicas: 1, timeoutMs: 50 } as const;

/** Rejection log lines: rule-and-identity keys the sampler tracks at once. */
export const REJECTION_LOG_MAX_KEYS = 10_000;

/** Leases (`lease` rules): keys whose units an instance holds at once; one evicted loses its units. */
export const LEASE_MAX_KEYS = 10_000;

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
    // On only where a failover can lose a write: Sentinel, Cluster, a server with replicas
    // (`LostWriteCheckSwitch`). A lone server has no replica to promote, and pays nothing.
    detectLostWrites: 'auto',
    // Off: in a measured failover it caught nothing the lost-write check did not (a replica has a
    // counter and its marker, or neither; figures in docs/failure-modes.md, "The marker"), and it
    // costs a write per admission high in a window and a TTL check on every call.
    marker: false,
    waitForReplicas: false,
  },
  // How long a request refused only because of `countOn` admissions still in flight may be held for
  // them to settle. The admissions it waits on are handlers of the same identity running now: a
  // password check (a slow hash, 50 to 300 ms), an API call (p99 well under 1 s). One second sees
  // several of them settle, and bounds what a refused client waits before its 429 (which starts no
  // penalty) to what users and proxies take as an ordinary slow answer. 5 s (the old default) held
  // a connection, a waiter and repeated store calls that long, often for a request refused after it
  // all (the admissions it waited on were concurrent wrong guesses, and counted).
  countOn: { inFlightWaitMs: 1_000 },
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

import type { RateLimitModuleOptions } from './options.js';

/**
 * Every default of the module's options, in one place. `resolveModuleOptions` applies them;
 * `docs/options.md` lists them. The constants below them are the values of what is no option: sizes
 * and periods of the library's internals, fixed here with the reason for each.
 */
export const RATE_LIMIT_DEFAULTS = {
  keyPrefix: 'rl',
  memoryStore: { maxKeys: 10_000 },
  blockCache: true,
  storeErrors: {
    policy: 'local',
    timeoutMs: 100,
    circuitBreaker: { consecutiveFailures: 5, halfOpenAfterMs: 250 },
    localFallback: { expectedInstances: 2 },
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
  logging: { level: 'warn' },
  ipv6PrefixBits: 64,
} as const satisfies RateLimitModuleOptions;

/**
 * The circuit breaker's second trigger, beside `consecutiveFailures`: it opens when this share of
 * the calls of a sliding window failed or timed out, counting only windows with this many calls. It
 * catches a Redis that fails one call in three or four and so never fails five in a row. The three
 * numbers mean something only together, and what a deployment tunes is how soon a Redis that stops
 * answering is left alone (`consecutiveFailures`, with `timeoutMs`) and how soon it is tried again
 * (`halfOpenAfterMs`): they stay options; these were options in earlier 0.3 builds.
 */
export const CIRCUIT_BREAKER_SHARE = { failureRatio: 0.3, minimumCalls: 20, windowMs: 10_000 } as const;

/** What `failover.waitForReplicas` waits for when it is given without them (it is off by default). */
export const REPLICA_WAIT_DEFAULTS = { replicas: 1, timeoutMs: 50 } as const;

/**
 * Sampling of the log lines the library writes: at most one line per key (a rule and identity, a
 * kind of store problem, a breaker transition) per `intervalMs`, counting the rest into it; at most
 * `maxLinesPerSecond` rejection lines (and refused live values) in all. The first line of a key is
 * written at once, so 10 s delays no news and keeps an attack or an outage to a few lines a minute
 * per key; 5 lines a second is about what a person reads in a live tail.
 */
export const LOG_SAMPLING = { intervalMs: 10_000, maxLinesPerSecond: 5 } as const;

/**
 * Keys whose last report each instance remembers for the local fallback, at least (more when
 * `memoryStore.maxKeys` is larger): enough for the identities a busy app sees in a window. Below
 * the keys in use, every request missed and evicted an entry, which then aged into the old
 * generation: 1-4 µs more a decision and 1-2 ms pauses at p99 (`npm run bench:core`, 10,000 keys).
 * Nothing is reserved at start; about 360 bytes a key held (35 MB at the bound).
 */
export const LAST_SEEN_MIN_KEYS = 100_000;

/** Rejection log lines: rule-and-identity keys the sampler tracks at once. */
export const REJECTION_LOG_MAX_KEYS = 10_000;

/** Leases (`lease` rules): keys whose units an instance holds at once; one evicted loses its units. */
export const LEASE_MAX_KEYS = 10_000;

/**
 * Keys the block cache holds at once, least recently used forgotten first: as many as the embedded
 * store's default, about 1 MB. An attack from more identities than this evicts some, which then
 * cost one Redis call each, as without the cache: the cache saves calls, it never decides alone.
 */
export const BLOCK_CACHE_MAX_KEYS = 10_000;

/**
 * The most the instances together admit in a window the `'local'` fallback decides while Redis is
 * out, as a multiple of the limit: each instance takes its part of what Redis last reported left,
 * rounded up, within this bound. Shares are whole units: rounding up gives a rule of 50 on 3
 * instances 17 each (51 in all, within 1.05x); where it would pass the bound, each takes its part
 * rounded down (a rule of 10 with 4 left on 3 instances: 1 each, never 2). One instance: exactly
 * the limit. (Until 2026-12-02 the bound was 1.2: a Cluster failover let a client of a 10-unit
 * rule through 1.2x-1.4x, `bench/cluster-failover.measure.ts`.)
 */
export const LOCAL_FALLBACK_BOUND = 1.05;

/**
 * The most the instances together admit in a window while Redis may be up but slow (a call past
 * its deadline that may have run): Redis may be admitting the limit on time elsewhere, so the
 * fallback shares only this margin above it (`test/integration/slow-redis.spec.ts`).
 */
export const SLOW_REDIS_BOUND = 1.2;

/**
 * A call past its deadline counts against Redis in the circuit breaker only if it is not answered
 * within this much more: a Redis that stalls for a fork or a slow command (150-500 ms) answers
 * late but answers, and its calls go on; one that does not answer in a second is failing. (The
 * request itself was decided at the deadline.)
 */
export const LATE_ANSWER_GRACE_MS = 1_000;

/**
 * Redis counts as down, not slow, this long after it left a call unanswered for
 * LATE_ANSWER_GRACE_MS (unless it answered one late since): meanwhile, the local fallback shares
 * all of what Redis last reported left, not only the margin a slow Redis leaves. 10 s spans the
 * circuit breaker's probes of a Redis that is down.
 */
export const SLOW_REDIS_MEMORY_MS = 10_000;

/**
 * How often an instance counts the instances sharing its Redis (`PUBSUB NUMSUB`), for the `'local'`
 * fallback's share of each limit: a new instance is counted within this, one cheap call per 5 s.
 */
export const INSTANCE_COUNT_REFRESH_MS = 5_000;

/**
 * The background key audit (health checks and metrics) scans every 10 minutes, one instance for all
 * that share the Redis: a key without a TTL is a slow symptom (a permanent ban reported by users
 * over hours), and a scan every few minutes would cost a large keyspace more than it finds.
 */
export const KEY_AUDIT_INTERVAL_MS = 600_000;

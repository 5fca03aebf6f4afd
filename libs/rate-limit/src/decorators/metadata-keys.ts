/** Metadata keys and defaults: internal, not part of the public API. */

export const RATE_LIMIT_RULES = 'rate-limit:rules';
export const RATE_LIMIT_SKIP = 'rate-limit:skip';

export const DEFAULT_KEY_PREFIX = 'rl';
export const DEFAULT_REDIS_TIMEOUT_MS = 100;
export const DEFAULT_IN_FLIGHT_WAIT_MS = 5_000;
export const DEFAULT_MEMORY_MAX_KEYS = 10_000;
export const DEFAULT_LOG_INTERVAL_MS = 10_000;
export const DEFAULT_LOG_MAX_LINES_PER_SECOND = 5;
export const DEFAULT_LOG_MAX_TRACKED = 10_000;

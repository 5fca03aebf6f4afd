/**
 * What a fixed window on the app's clock (the `clock` option) keeps in Redis: a hash at the state
 * key, and the same two fields at the marker key once its count is high (see `fixed-window.lua.ts`).
 * The letters are the stored format: data already in Redis is read by them, so they never change;
 * the names are what code calls them.
 */
export const FIXED_WINDOW_FIELDS = {
  /** The window's start, ms on the store's clock. */
  start: 's',
  /** Units admitted in the window. */
  count: 'c',
} as const;

/**
 * The Redis type of a fixed window's state key on Redis's clock (the default): an integer timed by
 * its TTL. With the module's `clock` option it is a hash of `FIXED_WINDOW_FIELDS` instead.
 */
export const FIXED_WINDOW_REDIS_TYPE = 'string';

/**
 * On Redis's clock a window's start is reckoned as `TIME + PTTL - window`, which may round a ms
 * either way: starts this close name the same window. Two windows of a key start a window apart;
 * a reset lets the next start at once, and is announced to every instance, which then forgets what
 * it saw of the key. A key deleted behind the library's back (`FLUSHDB`) starts a window that is
 * told apart from the last by its later start. (Redis 7 replicates a key's expiry as a time, so a
 * promoted replica reckons the same start; Redis 6 sends it as a TTL, shifted by the replica's lag.)
 */
export const WINDOW_START_SLACK_MS = 2;

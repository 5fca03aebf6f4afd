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

/**
 * What a sliding window counter keeps in Redis: a hash at the state key. The letters are the stored
 * format: data already in Redis is read by them, so they never change; the names are what code
 * calls them.
 */
export const SLIDING_WINDOW_FIELDS = {
  /** The window length the counts were made with: counts of another length are not reused. */
  window: 'w',
  /** The current window's index: its start divided by the window length. */
  index: 'i',
  /** Units admitted in the current window. */
  current: 'c',
  /** Units admitted in the window before it. */
  previous: 'p',
} as const;

export const SLIDING_WINDOW_REDIS_TYPE = 'hash';

/**
 * What a token bucket keeps in Redis: a hash at the state key. The letters are the stored format:
 * data already in Redis is read by them, so they never change; the names are what code calls them.
 */
export const TOKEN_BUCKET_FIELDS = {
  /** Tokens in the bucket at the last refill (fractional). */
  tokens: 't',
  /** The time of the last refill, ms on the store's clock. */
  refilledAt: 'r',
} as const;

export const TOKEN_BUCKET_REDIS_TYPE = 'hash';

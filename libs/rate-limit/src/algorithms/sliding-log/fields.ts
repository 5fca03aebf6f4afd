/**
 * What a sliding log keeps in Redis: no hash, but a sorted set at the state key with one member per
 * admission, scored by the time it was admitted and carrying its units: `time:nonce*units` (the
 * request's nonce, so members of one request never collide with another's and a refund finds its
 * own). A hit of any cost writes one member. Members of older versions, `time:nonce:unit` (one per
 * unit), count one unit each.
 */
export const SLIDING_LOG_REDIS_TYPE = 'zset';

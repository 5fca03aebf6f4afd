/**
 * What a sliding log keeps in Redis: no hash, but a sorted set at the state key with one member per
 * admitted unit, scored by the time it was admitted. A member is `time:nonce:unit` (the request's
 * nonce, and the unit from 1 to the hit's cost), so members of one request never collide with
 * another's and a refund can name exactly the members its request added.
 */
export const SLIDING_LOG_REDIS_TYPE = 'zset';

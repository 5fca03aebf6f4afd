// 'nest-rate-limit/store': for a store of your own (the `store` option), for the library's Redis
// and for reading what the stores keep. The contract, the in-process store, the key layout, the
// algorithms' names and the fields each stores in Redis; the Redis connection (`RedisService`), the script object its `run` takes, the error of
// a call past its deadline, the `redis` option from the environment, and the types of the `redis`,
// `storeErrors` (with its `circuitBreaker` and policy) and `failover` options.

export {
  RateLimitStore,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitConsumption,
  type RateLimitReceipt,
  type RateLimitRefund,
  type RateLimitSettlement,
  type RateLimitStanding,
  type LiftedKeysWatcher,
} from './rate-limit-store.js';
export { MemoryRateLimitStore } from './memory-rate-limit.store.js';
export { rateLimitKey, rateLimitKeys, keysBeside, keyIdOf, ruleKeyId, type RateLimitKeysBeside } from './key-layout.js';
export { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
export { STORED_FIELDS, STORED_TYPES } from '../algorithms/stored-fields.js';
export { RedisService } from '../redis/redis.service.js';
export { RedisScript } from '../redis/script-runner.js';
export { RedisTimeoutError } from '../redis/call-safety.js';
export { redisOptionsFromEnv } from '../redis/redis-options-from-env.js';
export type {
  RateLimitRedisOptions,
  RateLimitStoreErrorOptions,
  RateLimitStoreErrorPolicy,
  RateLimitFailoverOptions,
} from '../module/options.js';

// 'nest-rate-limit/store': for a store of your own (the `store` option) and for reading what the
// stores keep. The contract, the in-process store, the key layout, the fields each algorithm stores
// in Redis, and the script object `RedisService.run` takes.

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
export { STORED_FIELDS, STORED_TYPES } from '../algorithms/stored-fields.js';
export { RedisScript } from '../redis/redis-script.js';

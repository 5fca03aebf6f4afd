export { RateLimitModule } from './rate-limit.module.js';
export type {
  RateLimitModuleOptions,
  RateLimitModuleExtras,
  RateLimitRedisOptions,
  RateLimitLoggingOptions,
} from './rate-limit.options.js';
export { RateLimit, SkipRateLimit } from './rate-limit.decorator.js';
export type {
  RateLimitOptions,
  RateLimitBy,
  RateLimitIdentityResolver,
  RateLimitCost,
  RateLimitCountOn,
} from './rules/rate-limit-rule.js';
export { RateLimitConfigurationError } from './rules/rate-limit-rule.js';
export type { Duration } from './rules/duration.js';
export { RateLimitGuard } from './rate-limit.guard.js';
export { RateLimitInterceptor } from './rate-limit.interceptor.js';
export type { RateLimitHeaderStyle } from './rate-limit-headers.js';
export { RateLimitException, type RateLimitExceptionBody } from './rate-limit.exception.js';
export { RateLimiterService } from './rate-limiter.service.js';
export type { RateLimitOutcome, RuleDecision } from './rate-limit-outcome.js';
export { RateLimitConfigCentre, type RateLimitOverride } from './config-centre/rate-limit-config-centre.js';
export { NestConfigCentre } from './config-centre/nest-config-centre.js';
export {
  RateLimitStore,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitConsumption,
  type RateLimitReceipt,
  type RateLimitRefund,
  type RateLimitSettlement,
} from './stores/rate-limit-store.js';
export type { RateLimitAlgorithmName } from './algorithms/algorithm.js';
export { MemoryRateLimitStore } from './stores/memory-rate-limit.store.js';
export { RedisRateLimitStore } from './stores/redis-rate-limit.store.js';
export { RedisService, RedisTimeoutError } from './redis/redis.service.js';
export type { KeyAuditReport } from './audit/key-audit.js';
export { redisOptionsFromEnv } from './redis/redis-options-from-env.js';
export type { RateLimitCircuitBreakerOptions, CircuitBreakerState } from './redis/redis-circuit-breaker.js';
export type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

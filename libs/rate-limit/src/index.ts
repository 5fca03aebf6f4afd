export { RateLimitModule } from './module/rate-limit.module.js';
export type {
  RateLimitModuleOptions,
  RateLimitModuleExtras,
  RateLimitRedisOptions,
  RateLimitLoggingOptions,
} from './module/options.js';
export { RateLimit, SkipRateLimit } from './decorators/rate-limit.decorator.js';
export type {
  RateLimitOptions,
  RateLimitBy,
  RateLimitIdentityResolver,
  RateLimitCost,
  RateLimitCountOn,
} from './rules/rate-limit-rule.js';
export { RateLimitConfigurationError } from './rules/rate-limit-rule.js';
export type { Duration } from './rules/duration.js';
export { RateLimitGuard } from './http/rate-limit.guard.js';
export { RateLimitInterceptor } from './http/rate-limit.interceptor.js';
export type { RateLimitHeaderStyle } from './http/rate-limit-headers.js';
export { RateLimitException, type RateLimitExceptionBody } from './http/rate-limit.exception.js';
export { RateLimiterService } from './limiter/rate-limiter.service.js';
export type { RateLimitOutcome, RuleDecision } from './limiter/rate-limit-outcome.js';
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
} from './store/rate-limit-store.js';
export type { RateLimitAlgorithmName } from './algorithms/algorithm.js';
export { MemoryRateLimitStore } from './store/memory-rate-limit.store.js';
export { RedisRateLimitStore } from './redis/redis-rate-limit.store.js';
export { RedisService, RedisTimeoutError } from './redis/redis.service.js';
export type { KeyAuditReport } from './audit/key-audit.js';
export { redisOptionsFromEnv } from './redis/redis-options-from-env.js';
export type { RateLimitCircuitBreakerOptions, CircuitBreakerState } from './redis/redis-circuit-breaker.js';
export type { RateLimitStoreErrorPolicy } from './resilience/store-error-policy.js';

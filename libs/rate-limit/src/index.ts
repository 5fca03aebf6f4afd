// The public API. Everything a signature below mentions is exported here too; the rest is internal.

// Module and its options.
export { RateLimitModule } from './module/rate-limit.module.js';
export type {
  RateLimitModuleOptions,
  RateLimitModuleExtras,
  RateLimitModuleAsyncOptions,
  RateLimitRedisOptions,
  RateLimitStoreErrorOptions,
  RateLimitFailoverOptions,
  RateLimitLoggingOptions,
} from './module/options.js';
export { RATE_LIMIT_DEFAULTS } from './module/defaults.js';
export type { RateLimitCircuitBreakerOptions, CircuitBreakerState } from './redis/redis-circuit-breaker.js';
export type { RateLimitStoreErrorPolicy } from './resilience/store-error-policy.js';
export type { RateLimitHeaderStyle } from './http/rate-limit-headers.js';
export type { SampledLogLevel } from './logging/sampled-logger.js';

// Rules: the decorators and what they take.
export { RateLimit, SkipRateLimit } from './decorators/rate-limit.decorator.js';
export type {
  RateLimitOptions,
  RateLimitRule,
  RateLimitBy,
  RateLimitIdentity,
  RateLimitIdentityResolver,
  RateLimitCost,
  RateLimitCountOn,
  RateLimitMode,
} from './rules/rate-limit-rule.js';
export { RateLimitConfigurationError } from './rules/rate-limit-rule.js';
export type { Duration } from './rules/duration.js';
export { ALGORITHM_NAMES, type RateLimitAlgorithmName } from './algorithms/algorithm.js';

// HTTP: the guard, the interceptor, the 429.
export { RateLimitGuard } from './http/rate-limit.guard.js';
export { RateLimitInterceptor } from './http/rate-limit.interceptor.js';
export { RateLimitException, type RateLimitExceptionBody } from './http/rate-limit.exception.js';
export {
  RateLimitGraphQLError,
  type RateLimitGraphQLExtensions,
  type RateLimitWsError,
} from './transports/rate-limit-rejections.js';

// Deciding, in HTTP and outside it.
export { RateLimiterService, type RateLimitRuleRef } from './limiter/rate-limiter.service.js';
export type { RateLimitOutcome, RuleDecision, ConditionalUnits } from './limiter/rate-limit-outcome.js';

// Thresholds at run time.
export { RateLimitConfigCentre, type RateLimitOverride } from './config-centre/rate-limit-config-centre.js';
export { NestConfigCentre } from './config-centre/nest-config-centre.js';
export { LiveConfigCentre } from './config-centre/live-config-centre.js';
export { MemoryConfigCentre } from './config-centre/memory-config-centre.js';
export { RedisConfigCentre, type LiveConfigState } from './config-centre/redis-config-centre.js';

// Operating it: changing and watching limits while the app runs.
export {
  RateLimitManagementService,
  type RateLimitLimitEntry,
  type RateLimitRuleLimits,
} from './management/rate-limit-management.service.js';
export type { RateLimitInspection } from './limiter/rate-limit-inspection.js';
export { RateLimitHealthIndicator, type RateLimitHealth } from './health/rate-limit-health.indicator.js';
export type { RateLimitDecisionOutcome } from './metrics/decision-observer.js';

// Stores: the contract, the in-process store, the key layout.
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
} from './store/rate-limit-store.js';
export { MemoryRateLimitStore } from './store/memory-rate-limit.store.js';
export { rateLimitKey, rateLimitKeys, keysBeside, ruleKeyId, type RateLimitKeysBeside } from './store/key-layout.js';
export { STORED_FIELDS, STORED_TYPES } from './algorithms/stored-fields.js';

// Redis.
export { RedisService, RedisTimeoutError } from './redis/redis.service.js';
export { RedisScript } from './redis/redis-script.js';
export { redisOptionsFromEnv } from './redis/redis-options-from-env.js';
export type { KeyAuditReport } from './audit/key-audit.js';

// The front door: what an app needs to limit its routes and its jobs. Thresholds changed at run
// time are in 'nest-rate-limit/live', metrics, health and the key audit in 'nest-rate-limit/ops',
// the contract for a store of your own and the key layout in 'nest-rate-limit/store'. A type a
// signature here mentions is exported here or by one of those; the rest is internal.

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

// HTTP: the guard, the interceptor, the 429; the rejections of GraphQL and WebSocket.
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
export type { RateLimitInspection } from './limiter/rate-limit-inspection.js';

// Redis: the library's connection, the error of a call past its deadline, the options from env.
export { RedisService, RedisTimeoutError } from './redis/redis.service.js';
export { redisOptionsFromEnv } from './redis/redis-options-from-env.js';

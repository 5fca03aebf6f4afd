// The front door: what an app needs to limit its routes and its jobs. Thresholds changed at run
// time are in 'nest-rate-limit/live'; metrics, health, the key audit, the breaker's state and the
// logging options in 'nest-rate-limit/ops' (the wings, added as `extensions`); the contract for a
// store of your own, the key layout, the Redis connection, its options and its failure and failover
// options in 'nest-rate-limit/store'.
// A type a signature here mentions is exported here or by one of those; the rest is internal.

// Module and its options (the option groups' own types: see the entries above).
export { RateLimitModule } from './module/rate-limit.module.js';
export type { RateLimitModuleOptions, RateLimitModuleExtras, RateLimitModuleAsyncOptions } from './module/options.js';
export type { RateLimitExtension } from './module/extension.js';
export { RATE_LIMIT_DEFAULTS } from './module/defaults.js';
export type { RateLimitHeaderStyle } from './limiter/rate-limit-outcome.js';
export type { RateLimitStoreErrorPolicy } from './resilience/store-error-policy.js';

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
  RateLimitSkipIf,
  RateLimitSettleCost,
  RateLimitTier,
  RateLimitTierResolver,
} from './rules/rate-limit-rule.js';
export type { RateLimitAllowList, RateLimitAllowedUserAgent } from './rules/allow-list.js';
export type { RateLimitDefaultRule } from './rules/default-rules.js';
export { RateLimitConfigurationError } from './rules/rate-limit-rule.js';
export type { Duration } from './rules/duration.js';
export type { RateLimitAlgorithmName } from './algorithms/algorithm.js';

// HTTP: the guard, the interceptor, the 429; the rejections of GraphQL and WebSocket.
export { RateLimitGuard } from './http/rate-limit.guard.js';
export { RateLimitInterceptor } from './http/rate-limit.interceptor.js';
export type { RateLimitRequestDecision, RateLimitCostReport } from './http/request-cost-settlement.js';
export {
  RateLimitException,
  type RateLimitExceptionBody,
  RateLimitBannedException,
  type RateLimitBannedExceptionBody,
} from './limiter/rate-limit-outcome.js';
export {
  RateLimitGraphQLError,
  type RateLimitGraphQLExtensions,
  type RateLimitWsError,
} from './transports/rate-limit-rejections.js';

// Deciding, in HTTP and outside it.
export { RateLimiterService } from './limiter/rate-limiter.service.js';
export type { RateLimitRuleRef } from './rules/rate-limit-rule.registry.js';
export type {
  RateLimitOutcome,
  RuleDecision,
  ConditionalUnits,
  RateLimitNearLimitEvent,
  ReservedUnits,
} from './limiter/rate-limit-outcome.js';
export type { RateLimitInspection } from './limiter/rate-limit-inspection.js';

// Redis: the error of a call past its deadline, the `redis` option from the environment.
export { RedisTimeoutError } from './redis/call-safety.js';
export { redisOptionsFromEnv } from './redis/redis-options-from-env.js';

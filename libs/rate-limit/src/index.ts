// The front door: what an app needs to limit its routes and its jobs. Thresholds changed at run
// time are in 'nest-rate-limit/live'; metrics, health, the key audit, the breaker's state and the
// logging options in 'nest-rate-limit/ops' (the wings, added as `extensions`); the contract for a
// store of your own, the key layout, the algorithms' names, the Redis connection, its options and
// errors, and its failure and failover options (the store-error policy with them) in
// 'nest-rate-limit/store'.
// A type a signature here mentions is exported here or by one of those; the rest is internal. An
// option's members are not named: `RateLimitOptions['by']`, `RateLimitModuleOptions['headers']`.

// Module and its options.
export { RateLimitModule } from './module/rate-limit.module.js';
export type { RateLimitModuleOptions, RateLimitModuleExtras, RateLimitModuleAsyncOptions } from './module/options.js';
export type { RateLimitExtension } from './module/extension.js';
export { RATE_LIMIT_DEFAULTS } from './module/defaults.js';

// Rules: the decorators and what they take.
export { RateLimit, SkipRateLimit } from './decorators/rate-limit.decorator.js';
export type { RateLimitOptions, RateLimitRule, RateLimitMode } from './rules/rate-limit-rule.js';
export type { RateLimitAllowList } from './rules/allow-list.js';
export { RateLimitConfigurationError } from './rules/rate-limit-rule.js';

// HTTP: the guard, the interceptor, the 429 and the 403 of a ban (their bodies: `getResponse()`);
// the rejections of GraphQL and WebSocket.
export { RateLimitGuard } from './http/rate-limit.guard.js';
export { RateLimitInterceptor } from './http/rate-limit.interceptor.js';
export type { RateLimitRequestDecision } from './http/request-cost-settlement.js';
export { RateLimitException, RateLimitBannedException } from './http/rate-limit.exception.js';
export { RateLimitGraphQLError, type RateLimitWsError } from './transports/rate-limit-rejections.js';

// Deciding, in HTTP and outside it.
export { RateLimiterService } from './limiter/rate-limiter.service.js';
export type { RateLimitRuleRef } from './rules/rate-limit-rule.registry.js';
export type {
  RateLimitOutcome,
  RuleDecision,
  ConditionalUnits,
  ReservedUnits,
  RateLimitNearLimitEvent,
} from './limiter/rate-limit-outcome.js';
export type { RateLimitInspection } from './limiter/rate-limit-inspection.js';

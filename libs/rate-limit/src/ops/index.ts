// 'nest-rate-limit/ops': watching it run. The extensions an app adds to `RateLimitModule.forRoot`'s
// `extensions` (metrics, health, the key audit), the health indicator, what the metrics label a
// decision with, the circuit breaker's state (health and the metrics report it), the key audit and
// its report, Redis's memory as health reports it, and the types of the `logging` option.

export { rateLimitMetrics, rateLimitHealth, rateLimitKeyAudit } from './extensions.js';
export { RateLimitHealthIndicator, type RateLimitHealth } from './rate-limit-health.indicator.js';
export type { RateLimitDecisionOutcome } from '../limiter/decision-observer.js';
export type { CircuitBreakerState } from '../redis/call-safety.js';
export { RateLimitKeyAudit } from './rate-limit-key-audit.js';
export type { KeyAuditReport } from '../redis/key-audit.js';
export type { RedisMemoryState } from '../redis/redis-memory.js';
export type { RateLimitLoggingOptions } from '../module/options.js';
export type { SampledLogLevel } from '../logging/sampled-logger.js';

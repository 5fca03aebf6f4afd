// 'nest-rate-limit/ops': watching it run. The health indicator, what the metrics label a decision
// with (the metrics themselves come with the `metrics` option), and the key audit's report.

export { RateLimitHealthIndicator, type RateLimitHealth } from './rate-limit-health.indicator.js';
export type { RateLimitDecisionOutcome } from '../limiter/decision-observer.js';
export type { KeyAuditReport } from '../redis/key-audit.js';

// 'nest-rate-limit/live': thresholds at run time. The config centres (the `configCentre` option;
// the default, `NestConfigCentre`, lives in the core and is re-exported here), and the extension
// that adds the service writing and reading live limits (`rateLimitManagement()`,
// `RateLimitManagementService`).

export { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
export { NestConfigCentre } from '../limiter/nest-config-centre.js';
export { LiveConfigCentre } from './live-config-centre.js';
export { MemoryConfigCentre } from './memory-config-centre.js';
export { RedisConfigCentre, type LiveConfigState } from './redis-config-centre.js';
export { rateLimitManagement } from './extension.js';
export {
  RateLimitManagementService,
  RateLimitPermissionError,
  type RateLimitChangeAuthor,
  type RateLimitLimitEntry,
  type RateLimitRuleLimits,
} from './rate-limit-management.service.js';
export { RateLimitStoreUnavailableError } from './store-unavailable-error.js';
export type { RateLimitChange } from './change-log.js';
export type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';

// 'nest-rate-limit/live': thresholds at run time. The config centres (the `configCentre` option;
// the default, `NestConfigCentre`, lives in the core and is re-exported here), and the extension
// that adds the service writing and reading live limits (`rateLimitManagement()`,
// `RateLimitManagementService`). Limit values are given in one shape, `RateLimitOverride`, wherever
// they are: what a config centre holds for a key, what `set` writes, an identity's override; the
// entries `get`, `list` and `overrides` answer with carry them.

export { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
export { NestConfigCentre } from '../limiter/nest-config-centre.js';
export { LiveConfigCentre } from './live-config-centre.js';
export { MemoryConfigCentre } from './memory-config-centre.js';
export { RedisConfigCentre, type LiveConfigState } from './redis-config-centre.js';
export { rateLimitManagement } from './extension.js';
export { RateLimitManagementService } from './rate-limit-management.service.js';
export { RateLimitPermissionError } from './management-refusals.js';
export type { RateLimitChangeAuthor } from './authored-changes.js';
export type { RateLimitLimitEntry } from './limit-management.js';
export { RateLimitStoreUnavailableError } from './store-unavailable-error.js';
export type { RateLimitChange } from './change-log.js';
export type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';

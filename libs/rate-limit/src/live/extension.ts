import type { RateLimitExtension } from '../module/extension.js';
import { RateLimitManagementService } from './rate-limit-management.service.js';

/**
 * `RateLimitManagementService`: writing and reading live limits, bans and overrides while the app
 * runs, for admin endpoints (the `nest-rate-limit-limits` CLI uses it too), with its change log and,
 * with `RedisConfigCentre`, the rule catalogue the CLI checks values against.
 *
 * @example RateLimitModule.forRoot({ redis, configCentre: RedisConfigCentre, extensions: [rateLimitManagement()] })
 */
export function rateLimitManagement(): RateLimitExtension {
  return {
    name: 'rateLimitManagement',
    providers: [RateLimitManagementService],
    exports: [RateLimitManagementService],
  };
}

import { Inject, Injectable } from '@nestjs/common';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { type KeyAuditReport, auditRateLimitKeys } from '../redis/key-audit.js';
import { RedisService } from '../redis/redis.service.js';

/**
 * The audit of the library's keys in Redis, on demand: for monitoring, and for
 * `nest-rate-limit-audit-keys` (`npm run audit:keys`), which runs the same from a shell. The health
 * check and the metrics run it in the background (`KeyAuditSchedule`).
 */
@Injectable()
export class RateLimitKeyAudit {
  private readonly keyPrefix: string;

  /** @internal Nest creates it. */
  constructor(
    private readonly redis: RedisService,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) options: ResolvedRateLimitOptions,
  ) {
    this.keyPrefix = options.keyPrefix;
  }

  /**
   * Scans the library's keys on every master and reports those without a TTL; with `repairTtlMs`,
   * gives them that TTL. `scanCount`: keys asked for per SCAN call (default 1,000); `maxListed`: keys
   * listed in the report at most (all are counted). Throws when no Redis was configured.
   */
  run(options: { repairTtlMs?: number; scanCount?: number; maxListed?: number } = {}): Promise<KeyAuditReport> {
    return auditRateLimitKeys(this.redis, { keyPrefix: this.keyPrefix, ...options });
  }
}

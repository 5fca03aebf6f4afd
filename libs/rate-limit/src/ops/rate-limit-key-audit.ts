import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { type KeyAuditReport, auditRateLimitKeys } from '../redis/key-audit.js';
import { RedisService } from '../redis/redis.service.js';

/** Keys per SCAN in the background: small batches, so the PTTLs that follow never crowd out requests. */
const SCAN_COUNT = 100;
/** The longest a background audit may take; past it, it is abandoned and the last count stands. */
const AUDIT_DEADLINE_MS = 5 * 60_000;

/**
 * The audit of the library's keys in Redis: on demand (`run`), for monitoring and for
 * `nest-rate-limit-audit-keys` (`npm run audit:keys`), which runs the same from a shell; and in the
 * background for health checks and metrics (`keysWithoutTtl`), started by the first of them that
 * asks, so an app that watches neither never scans. Every `keyAudit.intervalMs` one instance
 * of those sharing the Redis audits (a lock, `<prefix>:config:audit-lock`) and leaves its count in
 * `<prefix>:config:audit`; the others read it. So 50 instances scan as often as one, counting only.
 */
@Injectable()
export class RateLimitKeyAudit implements OnApplicationShutdown {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private count: number | undefined;
  private readonly lockKey: string;
  private readonly resultKey: string;

  /** @internal Nest creates it. */
  constructor(
    private readonly redis: RedisService,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {
    this.lockKey = `${options.keyPrefix}:config:audit-lock`;
    this.resultKey = `${options.keyPrefix}:config:audit`;
  }

  /**
   * Scans the library's keys on every master and reports those without a TTL; with `repairTtlMs`,
   * gives them that TTL. `scanCount`: keys asked for per SCAN call (default 1,000); `maxListed`: keys
   * listed in the report at most (all are counted). Throws when no Redis was configured.
   */
  run(options: { repairTtlMs?: number; scanCount?: number; maxListed?: number } = {}): Promise<KeyAuditReport> {
    return auditRateLimitKeys(this.redis, { keyPrefix: this.options.keyPrefix, ...options });
  }

  /** Keys without a TTL at the last audit, if one has finished. Starts the schedule on the first call. */
  get keysWithoutTtl(): number | undefined {
    this.start();
    return this.count;
  }

  onApplicationShutdown(): void {
    clearInterval(this.timer);
  }

  private start(): void {
    if (this.timer || !this.redis.isConfigured) return;
    this.timer = setInterval(() => this.refresh(), this.options.keyAudit.intervalMs);
    this.timer.unref();
    this.refresh();
  }

  private refresh(): void {
    this.running ??= this.audit()
      .catch(() => undefined)
      .finally(() => (this.running = undefined));
  }

  private async audit(): Promise<void> {
    const { runner } = this.redis;
    const intervalMs = this.options.keyAudit.intervalMs;
    const won = await runner.operation((client) => client.set(this.lockKey, '1', 'PX', intervalMs, 'NX'), 'SET');
    if (won === 'OK') {
      const report = await runner.operation(
        () => this.run({ scanCount: SCAN_COUNT, maxListed: 0 }),
        'the key audit',
        Math.min(AUDIT_DEADLINE_MS, intervalMs),
      );
      this.count = report.withoutTtlCount;
      await runner.operation((client) => client.set(this.resultKey, String(this.count), 'PX', 2 * intervalMs), 'SET');
      return;
    }
    const shared = await runner.operation((client) => client.get(this.resultKey), 'GET');
    if (shared !== null && /^\d+$/.test(shared)) this.count = Number(shared);
  }
}

import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitKeyAudit } from './rate-limit-key-audit.js';

/** Keys per SCAN in the background: small batches, so the PTTLs that follow never crowd out requests. */
const SCAN_COUNT = 100;
/** The longest a background audit may take; past it, it is abandoned and the last count stands. */
const AUDIT_DEADLINE_MS = 5 * 60_000;

/**
 * The key audit in the background, for health checks and metrics: started by the first of them
 * that asks, so an app that watches neither never scans. Every `keyAudit.intervalMs` one instance
 * of those sharing the Redis audits (a lock, `<prefix>:config:audit-lock`) and leaves its count in
 * `<prefix>:config:audit`; the others read it. So 50 instances scan as often as one, counting only.
 */
@Injectable()
export class KeyAuditSchedule implements OnApplicationShutdown {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private count: number | undefined;
  private readonly lockKey: string;
  private readonly resultKey: string;

  constructor(
    private readonly redis: RedisService,
    private readonly keyAudit: RateLimitKeyAudit,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {
    this.lockKey = `${options.keyPrefix}:config:audit-lock`;
    this.resultKey = `${options.keyPrefix}:config:audit`;
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
    this.timer = setInterval(() => this.run(), this.options.keyAudit.intervalMs);
    this.timer.unref();
    this.run();
  }

  private run(): void {
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
        () => this.keyAudit.run({ scanCount: SCAN_COUNT, maxListed: 0 }),
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

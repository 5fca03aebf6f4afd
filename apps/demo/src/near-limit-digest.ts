import type { LoggerService } from '@nestjs/common';

/**
 * The demo's `onNearLimit` log: the first tenant to cross a rule's `nearLimit` in an interval is
 * logged at once, and the others of that interval are summed into one line when the next interval
 * begins. A flood of tenants near their limits (each crossing is its own event) writes at most two
 * lines per rule per interval, never one per tenant.
 */
export class NearLimitDigest {
  private readonly rules = new Map<string, { since: number; more: number }>();

  constructor(
    private readonly logger: LoggerService,
    private readonly intervalMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  crossed(rule: string, identity: string, remaining: number): void {
    const now = this.now();
    const interval = this.rules.get(rule);
    if (interval && now - interval.since < this.intervalMs) {
      interval.more += 1;
      return;
    }
    if (interval && interval.more > 0) {
      this.logger.log(`${interval.more} more near the limit of ${rule} in ${this.intervalMs / 1000} s`, 'NearLimit');
    }
    this.rules.set(rule, { since: now, more: 0 });
    this.logger.log(`${identity} is near the limit of ${rule}: ${remaining} left`, 'NearLimit');
  }
}

import { Logger } from '@nestjs/common';
import type { ChangeLog, RateLimitChange } from './change-log.js';
import { permitted } from './management-refusals.js';

/** Who makes a change (`set`, `delete`, `reset`), for the change log: the CLI's user, an admin endpoint's caller. */
export interface RateLimitChangeAuthor {
  /** Default `'unknown'`. */
  by?: string;
}

/** The most changes read back at once: all the log keeps. */
const LATEST_MAX = 1_000;

/**
 * The change log as `RateLimitManagementService` keeps it: each change recorded, with who made it,
 * before it is made, and logged; the latest read back.
 */
export class AuthoredChanges {
  private readonly logger = new Logger('RateLimit');

  constructor(private readonly log: ChangeLog) {}

  /**
   * Logs a change before it is made: a change Redis will not log (no permission) is not made, and
   * every change made carries who made it.
   */
  async record(author: RateLimitChangeAuthor | undefined, change: Omit<RateLimitChange, 'at' | 'by'>): Promise<void> {
    const by = author?.by || 'unknown';
    await permitted(
      change.change,
      () => this.log.record({ at: new Date().toISOString(), by, ...change }),
      ' nothing was changed.',
    );
    this.logger.log(`Live change by ${JSON.stringify(by)}: ${JSON.stringify(change)}`);
  }

  /** The latest `count` changes (1 to 1,000), newest first. */
  latest(count: number): Promise<RateLimitChange[]> {
    const latest = Math.min(LATEST_MAX, Math.max(1, Math.floor(count) || 1));
    return permitted('changeLog', () => this.log.latest(latest), '');
  }
}

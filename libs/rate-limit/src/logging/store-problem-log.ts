import { Logger } from '@nestjs/common';
import { SampledLogger } from './sampled-logger.js';

/**
 * Where the store and the layers around it report what went wrong or was mended: failed calls,
 * keys repaired, writes lost, replicas missing. One sampled logger for all of them, at `error`,
 * at most one line a second: an outage under load writes a line a second, not one per request.
 */
export class StoreProblemLog {
  private readonly lines: SampledLogger;

  constructor(intervalMs: number) {
    this.lines = new SampledLogger(new Logger('RateLimit'), {
      intervalMs,
      maxLinesPerSecond: 1,
      maxKeys: 100,
      level: 'error',
      summary: 'Rate-limit store failed',
    });
  }

  /** Counts one problem under `id`; `message` describes it in its lines. */
  report(id: string, message: string): void {
    this.lines.record(id, message);
  }

  close(): void {
    this.lines.close();
  }
}

import type { LoggerService } from '@nestjs/common';

export type SampledLogLevel = 'error' | 'warn' | 'log' | 'debug' | 'verbose';

export interface SampledLoggerOptions {
  /** At most one line per key per interval; the line counts the events since the key's last line. */
  intervalMs: number;
  /** At most this many lines per second over all keys; the rest is summed into one line per interval. */
  maxLinesPerSecond: number;
  /** Keys remembered at once; an evicted key's pending count goes into the summary line. */
  maxKeys: number;
  level: SampledLogLevel;
  /** Starts the line that sums keys past the line cap, e.g. `'Rejections of other keys'`. */
  summary: string;
}

interface Entry {
  subject: string;
  pending: number;
  lastLineAt: number;
}

/**
 * Logs repeated events (rejections, store errors) by sampling, so an attack cannot fill the disk:
 * the first event of a key is logged at once; later ones are counted and reported together, at most
 * once per key per interval and at most `maxLinesPerSecond` lines in all. Every event is counted in
 * exactly one line (`…: N since last report`), so the reported counts add up to the events.
 */
export class SampledLogger {
  private readonly entries = new Map<string, Entry>();
  /** The key set last in `entries`, hence its last while it is there. */
  private newest: string | undefined;
  private readonly options: SampledLoggerOptions;
  private second = -1;
  private linesThisSecond = 0;
  private unkeyedPending = 0;
  private unkeyedKeys = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly logger: LoggerService,
    options: SampledLoggerOptions,
  ) {
    this.options = options;
  }

  /**
   * Counts one event under `key`; `subject` describes the key in its lines (a function: made only
   * when the key is new, since most events of a busy key write nothing).
   */
  record(key: string, subject: string | (() => string)): void {
    const now = Date.now();
    let entry = this.entries.get(key);
    // Recently active keys kept at the end, so eviction takes the quietest; an attack's key, the
    // newest again and again, is there already.
    if (!entry || key !== this.newest) {
      if (entry) {
        this.entries.delete(key);
      } else {
        entry = {
          subject: typeof subject === 'function' ? subject() : subject,
          pending: 0,
          lastLineAt: Number.NEGATIVE_INFINITY,
        };
        if (this.entries.size >= this.options.maxKeys) this.evictOldest();
      }
      this.entries.set(key, entry);
      this.newest = key;
    }
    entry.pending += 1;
    if (now - entry.lastLineAt >= this.options.intervalMs && this.takeLine(now)) {
      this.emit(entry, now);
    } else {
      this.startTimer();
    }
  }

  /**
   * Reports what is pending: keys whose interval has passed (all keys, with `force`) get their own
   * line while the line cap allows; the rest are summed into one line.
   */
  flush(force = false): void {
    const now = Date.now();
    for (const [key, entry] of this.entries) {
      if (entry.pending > 0 && (force || now - entry.lastLineAt >= this.options.intervalMs)) {
        if (this.takeLine(now)) this.emit(entry, now);
        else this.moveToSummary(entry);
      }
      if (entry.pending === 0 && now - entry.lastLineAt >= this.options.intervalMs) this.entries.delete(key);
    }
    if (this.unkeyedPending > 0) {
      this.write(
        `${this.options.summary} (${this.unkeyedKeys} keys past the log line cap): ${this.unkeyedPending} since last report`,
      );
      this.unkeyedPending = 0;
      this.unkeyedKeys = 0;
    }
    if (this.entries.size === 0) this.stopTimer();
  }

  /** Reports what is pending and stops the timer: call on shutdown. */
  close(): void {
    this.flush(true);
    this.stopTimer();
  }

  private emit(entry: Entry, now: number): void {
    this.write(`${entry.subject}: ${entry.pending} since last report`);
    entry.pending = 0;
    entry.lastLineAt = now;
  }

  private write(message: string): void {
    const { level } = this.options;
    const log = this.logger[level]?.bind(this.logger) ?? this.logger.log.bind(this.logger);
    log(message);
  }

  private takeLine(now: number): boolean {
    const second = Math.floor(now / 1000);
    if (second !== this.second) {
      this.second = second;
      this.linesThisSecond = 0;
    }
    if (this.linesThisSecond >= this.options.maxLinesPerSecond) return false;
    this.linesThisSecond += 1;
    return true;
  }

  private moveToSummary(entry: Entry): void {
    this.unkeyedPending += entry.pending;
    this.unkeyedKeys += 1;
    entry.pending = 0;
  }

  private evictOldest(): void {
    const [oldestKey, oldest] = this.entries.entries().next().value as [string, Entry];
    this.entries.delete(oldestKey);
    if (oldest.pending > 0) this.moveToSummary(oldest);
  }

  private startTimer(): void {
    if (this.timer) return;
    this.timer = setInterval(() => this.flush(), this.options.intervalMs);
    this.timer.unref();
  }

  private stopTimer(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}

import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { SampledLogger, type SampledLoggerOptions } from './sampled-logger.js';

class Lines {
  readonly lines: string[] = [];
  log = (message: string) => this.lines.push(message);
  error = this.log;
  warn = this.log;

  /** The counts the lines report, summed. */
  total(): number {
    return this.lines.reduce((sum, line) => sum + Number(/(\d+) since last report/.exec(line)![1]), 0);
  }
}

const options: SampledLoggerOptions = {
  intervalMs: 10_000,
  maxLinesPerSecond: 5,
  maxKeys: 1_000,
  level: 'warn',
  summary: 'Others',
};

describe('SampledLogger', () => {
  beforeEach(() => vi.useFakeTimers({ now: new Date('2026-01-01T00:00:00Z') }));
  afterEach(() => vi.useRealTimers());

  it('turns 1,000 rejections of one identity within a second into two lines whose counts add up to 1,000', () => {
    const out = new Lines();
    const logger = new SampledLogger(out, options);
    for (let i = 0; i < 1_000; i += 1) {
      logger.record('rule:1.2.3.4', 'Rejected by rule r, key rl:r:1.2.3.4');
      vi.advanceTimersByTime(0.9); // 1,000 events over 0.9 s
    }
    expect(out.lines).toEqual(['Rejected by rule r, key rl:r:1.2.3.4: 1 since last report']);
    vi.advanceTimersByTime(options.intervalMs);
    expect(out.lines).toHaveLength(2);
    expect(out.total()).toBe(1_000);
  });

  it('logs at most one line per key per interval under steady rejections, losing no count', () => {
    const out = new Lines();
    const logger = new SampledLogger(out, options);
    for (let second = 0; second < 60; second += 1) {
      for (let i = 0; i < 100; i += 1) logger.record('k', 'key k');
      vi.advanceTimersByTime(1_000);
    }
    logger.close();
    expect(out.lines.length).toBeLessThanOrEqual(60 / 10 + 2);
    expect(out.total()).toBe(6_000);
  });

  it('caps lines per second over many identities and reports the rest in one summary line', () => {
    const out = new Lines();
    const logger = new SampledLogger(out, options);
    for (let ip = 0; ip < 500; ip += 1) logger.record(`ip-${ip}`, `key ip-${ip}`);
    expect(out.lines).toHaveLength(options.maxLinesPerSecond);
    vi.advanceTimersByTime(options.intervalMs);
    // The next flush may use one second's budget for keyed lines and sums the remainder.
    expect(out.lines.length).toBeLessThanOrEqual(2 * options.maxLinesPerSecond + 1);
    expect(out.lines.at(-1)).toMatch(/^Others \(\d+ keys past the log line cap\): \d+ since last report$/);
    expect(out.total()).toBe(500);
  });

  it('keeps the count of keys evicted beyond maxKeys', () => {
    const out = new Lines();
    const logger = new SampledLogger(out, { ...options, maxKeys: 10, maxLinesPerSecond: 1 });
    for (let ip = 0; ip < 100; ip += 1) {
      logger.record(`ip-${ip}`, `key ip-${ip}`);
      logger.record(`ip-${ip}`, `key ip-${ip}`);
    }
    logger.close();
    expect(out.total()).toBe(200);
  });

  it('keeps the line cap on close, summing what does not fit', () => {
    const out = new Lines();
    const logger = new SampledLogger(out, options);
    for (let ip = 0; ip < 5_000; ip += 1) {
      logger.record(`ip-${ip}`, `key ip-${ip}`);
      logger.record(`ip-${ip}`, `key ip-${ip}`);
    }
    logger.close();
    expect(out.lines.length).toBeLessThanOrEqual(2 * options.maxLinesPerSecond + 1);
    expect(out.total()).toBe(10_000);
  });

  it('stops its timer when nothing is pending', () => {
    const logger = new SampledLogger(new Lines(), options);
    logger.record('k', 'key k');
    logger.record('k', 'key k');
    expect(vi.getTimerCount()).toBe(1);
    vi.advanceTimersByTime(3 * options.intervalMs);
    expect(vi.getTimerCount()).toBe(0);
  });
});

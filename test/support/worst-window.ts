import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';

/** The most one window admitted, read as the algorithm promises it, and how it was read. */
export interface WorstWindow {
  admitted: number;
  how: string;
}

/**
 * The most a window of a rule (`limit` per `windowMs`) admitted, by what its algorithm promises,
 * from the times of the admissions (ms on `Date.now()`'s clock, sorted):
 * - fixed window, sliding log: any span of one window (a fixed window's start at its first request
 *   is this clock's within a few ms; a sliding log promises every span);
 * - sliding window: each window aligned as it aligns them (multiples of the window since the epoch),
 *   its estimate at each admission: the previous window's count, weighted by the part of it the
 *   sliding window still covers, plus the current one's;
 * - token bucket, GCRA: what passed since the first admission (the bucket full then) less what the
 *   bucket allows since (its burst, then the limit per window), added to one window's limit: a bucket
 *   refused during an outage may catch up after it, as it would have admitted then.
 *
 * What a limiter admitted within its promise reads as at most `limit`.
 */
export function worstWindow(
  algorithm: RateLimitAlgorithmName,
  { limit, windowMs }: { limit: number; windowMs: number },
  admittedAt: readonly number[],
): WorstWindow {
  if (admittedAt.length === 0) return { admitted: 0, how: 'nothing admitted' };
  if (algorithm === 'token-bucket' || algorithm === 'gcra') {
    const first = admittedAt[0];
    let excess = -Infinity;
    admittedAt.forEach((at, i) => (excess = Math.max(excess, i + 1 - (limit + (limit * (at - first)) / windowMs))));
    return {
      admitted: limit + Math.max(0, Math.ceil(excess)),
      how: 'the limit plus the most admitted since the first admission beyond the burst and the rate',
    };
  }
  if (algorithm === 'sliding-window') {
    const perWindow = new Map<number, number>();
    let most = 0;
    for (const at of admittedAt) {
      const index = Math.floor(at / windowMs);
      const current = (perWindow.get(index) ?? 0) + 1;
      perWindow.set(index, current);
      const previous = perWindow.get(index - 1) ?? 0;
      most = Math.max(most, (previous * (windowMs - (at - index * windowMs))) / windowMs + current);
    }
    return {
      admitted: Math.round(most),
      how: 'its estimate at an admission: the previous aligned window weighted, plus the current',
    };
  }
  let most = 0;
  for (let i = 0, j = 0; i < admittedAt.length; i += 1) {
    while (j < admittedAt.length && admittedAt[j] < admittedAt[i] + windowMs) j += 1;
    most = Math.max(most, j - i);
  }
  return { admitted: most, how: `the most within any ${windowMs} ms` };
}

import { parseCount } from './duration.js';
import type { Fail } from './compiled-rule.js';
import type { RateLimitOptions } from './rule-options.js';

/**
 * How long a slot stays taken without word from the instance that holds it: a request still running
 * has it renewed (every third of this), so only a crashed instance's slots run out, and come back.
 */
export const SLOT_LEASE_MS = 30_000;

/**
 * The most slots a cap may have. Each slot in flight is one member of the cap's log, which every
 * decision reads: past this, a cap costs the store more than any rate would.
 */
export const MAX_CONCURRENCY = 10_000;

/** The options a cap takes no value for: it has no window, and its slots always come back. */
const NOT_FOR_CAPS = ['count', 'window', 'algorithm', 'burst', 'blockFor', 'lease', 'tiers', 'settleCost'] as const;

/**
 * A rule's `concurrency`, checked; undefined for a rule that caps a rate. A cap is counted as a
 * sliding log of `SLOT_LEASE_MS` holding `concurrency` units: each admission is a slot, refunded
 * when its request ends (`ConcurrencyStep`), so the log holds the requests in flight.
 * @param fail throws, naming the rule and the field
 */
export function concurrencyOf(options: RateLimitOptions, fail: Fail): number | undefined {
  const { concurrency } = options;
  if (concurrency === undefined) return undefined;
  if (typeof concurrency !== 'number' || parseCount(concurrency) === undefined || concurrency > MAX_CONCURRENCY) {
    fail('concurrency', `must be a whole number of requests in flight from 1 to ${MAX_CONCURRENCY}`, concurrency);
  }
  for (const field of NOT_FOR_CAPS) {
    const value = options[field];
    if (value !== undefined) {
      fail(
        field,
        "does not apply to a 'concurrency' cap: a cap and a rate are two rules (@RateLimit({ concurrency }) and @RateLimit({ count, window }) on one handler are decided together)",
        value,
      );
    }
  }
  // A slot is given back whatever the response: counting only some would leave the others taken.
  if (options.countOn !== undefined && options.countOn !== 'all') {
    fail(
      'countOn',
      "does not apply to a 'concurrency' cap: its slot is given back however the request ends",
      options.countOn,
    );
  }
  return concurrency;
}

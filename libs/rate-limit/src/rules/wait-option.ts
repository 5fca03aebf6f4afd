import { parseCount, parseDuration } from './duration.js';
import type { Fail, RateLimitRule } from './compiled-rule.js';
import type { RateLimitOptions } from './rule-options.js';

/** Requests that may wait per key and instance when a rule's `wait` names no `maxQueued`. */
export const DEFAULT_MAX_QUEUED = 100;
/** The longest wait of a rule whose window is shorter: a few windows of a rate per second. */
export const SHORT_WINDOW_WAIT_MS = 60_000;
/** The longest wait of any rule: a request waiting longer is a job for a queue of the app's own. */
export const LONGEST_WAIT_MS = 3_600_000;
/** The most `wait.maxQueued` may be: each waiter holds a request, a socket and a timer. */
export const MAX_QUEUED = 10_000;

/** A rule's `wait`, as the compiled rule keeps it. */
export type RuleWait = NonNullable<RateLimitRule['wait']>;

/**
 * A rule's `wait`, checked against the rule it is on; undefined without one.
 * @param windowMs the rule's window (a cap's lease)
 */
export function waitOf(options: RateLimitOptions, windowMs: number, fail: Fail): RuleWait | undefined {
  const given = options.wait;
  if (given === undefined) return undefined;
  if (given === null || typeof given !== 'object' || Array.isArray(given)) {
    fail('wait', 'must be { maxMs, maxQueued? }: how long a request may wait for room, and how many may', given);
  }
  // A wait without a bound would hold a request, its socket and its client for ever.
  if (given.maxMs === undefined)
    fail('wait.maxMs', 'is required: the longest a request may wait for room', given.maxMs);
  const maxMs = parseDuration(given.maxMs);
  if (maxMs === undefined) fail('wait.maxMs', "must be a positive duration such as 2000 or '2s'", given.maxMs);
  // Past its window a rule has given all its room back several times: a wait that long is a queue
  // the app should hold itself. A short window may still make a request wait a few of them.
  const longest = Math.min(Math.max(windowMs, SHORT_WINDOW_WAIT_MS), LONGEST_WAIT_MS);
  if (maxMs! > longest) {
    fail(
      'wait.maxMs',
      `is longer than the rule's window (a minute for a shorter one, an hour at most: ${longest} ms here)`,
      given.maxMs,
    );
  }
  const maxQueued = given.maxQueued ?? DEFAULT_MAX_QUEUED;
  if (typeof maxQueued !== 'number' || parseCount(maxQueued) === undefined || maxQueued > MAX_QUEUED) {
    fail('wait.maxQueued', `must be a whole number of requests from 1 to ${MAX_QUEUED}`, given.maxQueued);
  }
  // A penalty refuses for its length whatever frees up; a leased unit is decided without the store.
  if (options.blockFor !== undefined) fail('wait', "cannot be combined with 'blockFor'", given);
  if (options.lease !== undefined) fail('wait', "cannot be combined with 'lease'", given);
  // Its refusals wait on admissions in flight already (`countOn.inFlightWaitMs`), outside this wait's time.
  if (options.countOn !== undefined && options.countOn !== 'all')
    fail('wait', "cannot be combined with 'countOn'", given);
  return { maxMs: maxMs!, maxQueued };
}

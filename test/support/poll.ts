/** How long to wait, how often to look, and what is awaited (named in the error on timeout). */
export interface UntilOptions {
  timeoutMs: number;
  /** Default 50 ms. */
  intervalMs?: number;
  /** What the condition means, as in "`what` did not happen within N ms". */
  what: string;
}

/**
 * Checks `condition` at once and then every `intervalMs` until it holds; throws naming `what` if it
 * still does not after `timeoutMs`. A condition that throws ends the wait with its error.
 *
 * Only for conditions outside this process that send no event here: a key expiring on Redis's own
 * clock, Redis running calls it received while paused, a port starting to accept, a failover. Where
 * an event or a fake clock can tell, use those instead.
 *
 * The deadline is on `performance.now()`, which suites that fake only `Date` leave real.
 */
export async function until(
  condition: () => boolean | Promise<boolean>,
  { timeoutMs, intervalMs = 50, what }: UntilOptions,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    const left = deadline - performance.now();
    if (left <= 0) throw new Error(`${what} did not happen within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, Math.min(intervalMs, left)));
  }
}

/** What `usedOnceSettled` reads: `RateLimiterService.inspect`. */
interface Inspecting {
  inspect(rule: string, identity: string): Promise<{ used: number }>;
}

/**
 * The units `inspect` reports used under a rule, once they are `expected` or after 100 turns of the
 * event loop: a settlement (`countOn`, `settleCost`) runs once the answer is out, so a read made at
 * once may come a turn early. Returns what it read last, for the test to assert.
 */
export async function usedOnceSettled(
  limiter: Inspecting,
  rule: string,
  identity: string,
  expected: number,
): Promise<number> {
  for (let turn = 0; turn < 100; turn += 1) {
    const { used } = await limiter.inspect(rule, identity);
    if (used === expected) return used;
    await new Promise((resolve) => setImmediate(resolve));
  }
  return (await limiter.inspect(rule, identity)).used;
}

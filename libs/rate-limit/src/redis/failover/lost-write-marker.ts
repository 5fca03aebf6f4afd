import type { RateLimitHit } from '../../store/rate-limit-store.js';

/**
 * A defence in the fixed window's Lua, off by default (`failover.marker`): once a window's count
 * reaches `share` of the limit, it is also written to the marker key (as long as its counter; two
 * windows for the hash form of the `clock` option), and a window whose counter is missing resumes
 * from the marker. A failover cannot leave that: the counter and its marker are written by one
 * script and replicated together, so a promoted replica has both or neither (measured in
 * `test/integration/failover-loss.spec.ts`: it adds nothing to the lost-write check there). What it
 * covers is a counter gone while its marker stays (deleted by hand, evicted). The count from which a
 * hit writes it; 0: never.
 */
export function markerFrom(share: number | false, hit: RateLimitHit): number {
  if (share === false || hit.algorithm !== 'fixed-window') return 0;
  return Math.max(1, Math.ceil(hit.limit * share));
}

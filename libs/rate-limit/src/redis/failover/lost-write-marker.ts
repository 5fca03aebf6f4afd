import type { RateLimitHit } from '../../store/rate-limit-store.js';

/**
 * A failover defence in the fixed window's Lua: once a window's count reaches `share` of the limit,
 * it is also written to the marker key (as long as the window; two windows for the hash form of the
 * `clock` option), and a window whose counter is missing (a replica promoted without it) resumes
 * from the marker. The count from which a hit writes it; 0: never.
 */
export function markerFrom(share: number | false, hit: RateLimitHit): number {
  if (share === false || hit.algorithm !== 'fixed-window') return 0;
  return Math.max(1, Math.ceil(hit.limit * share));
}

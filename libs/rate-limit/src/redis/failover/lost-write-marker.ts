import type { RateLimitHit } from '../../store/rate-limit-store.js';

/**
 * A failover defence in the fixed window's Lua: once a window's count reaches `share` of the limit,
 * it is also written to the marker key (two windows long), and a window whose counter is missing (a
 * replica promoted without it) resumes from the marker. The count from which a hit writes it; 0: never.
 */
export function markerFrom(share: number | false, hit: RateLimitHit): number {
  if (share === false || hit.algorithm !== 'fixed-window') return 0;
  return Math.max(1, Math.ceil(hit.limit * share));
}

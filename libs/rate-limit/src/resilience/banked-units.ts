import type { RateLimitConsumption, RateLimitHit } from '../store/rate-limit-store.js';
import type { LastSeen, LastSeenKeys } from './last-seen.js';
import type { UnitsToRecord } from './pending-units.js';

/**
 * Squares what the local fallback decided at a deadline with what Redis, slow, decided late for the
 * same request (`reconcile`). Units Redis admitted late to requests refused here are banked in
 * their window (`LastSeen.banked`): Redis counted them and no client had them, so a later request
 * decided here may take them (`take`), within the limit whatever the others admitted.
 */
export class BankedUnits {
  /**
   * @param onBanked told of a key units were banked for: a refusal of Redis's that a layer above
   *   keeps (the block cache) no longer holds on this instance, which may admit with them
   */
  constructor(
    private readonly lastSeen: LastSeenKeys,
    private readonly pending: UnitsToRecord,
    private readonly onBanked: ((key: string) => void) | undefined,
  ) {}

  /**
   * What Redis answered, late, to a request this instance decided at its deadline without recording
   * it (`consume`, `recorded` false), once `LastSeenKeys.remember` has learned the counts from it: undefined if
   * the call was lost with its connection, unknown whether it ran. Each way the two decisions can
   * differ is settled so that what clients got is what Redis counts:
   * - Redis admitted what was refused here: its units are banked, for a later request decided here.
   * - Redis refused (or never ran) what was admitted here: those units are recorded in Redis.
   * - Both admitted: counted once, in Redis; the share here gets the units back.
   * Only in the window Redis counted it in, where that is the one this instance decides in.
   */
  reconcile(
    hits: readonly RateLimitHit[],
    late: RateLimitConsumption | undefined,
    admittedHere: boolean,
    now: number,
  ): void {
    hits.forEach((hit, i) => {
      const seen = this.lastSeen.get(hit.key);
      if (!seen || seen.resetAt <= now) return;
      if (late && Math.abs(now + late.decisions[i].resetMs - seen.resetAt) > this.lastSeen.matchMs(hit)) return;
      if (!late?.allowed) {
        if (admittedHere) this.pending.add(hit, seen.resetAt, now);
      } else if (admittedHere) seen.admitted = Math.max(0, seen.admitted - hit.cost);
      else {
        seen.banked += hit.cost;
        this.lastSeen.banked.add(hit.key);
        this.onBanked?.(hit.key);
      }
    });
  }

  /**
   * The windows of an admission of banked units, taken from them, if every hit's window has enough:
   * counted in Redis already, whatever decided this request (the fallback, or Redis refusing it on
   * time for want of the very units it counted for those).
   */
  take(hits: readonly RateLimitHit[], now: number): LastSeen[] | undefined {
    if (this.lastSeen.banked.size === 0) return undefined;
    const windows: LastSeen[] = [];
    for (const hit of hits) {
      const seen = this.lastSeen.get(hit.key);
      if (!seen || seen.resetAt <= now) {
        this.lastSeen.banked.delete(hit.key);
        return undefined;
      }
      if (seen.banked < hit.cost || seen.blockedUntil > now) return undefined;
      windows.push(seen);
    }
    hits.forEach((hit, i) => {
      windows[i].banked -= hit.cost;
      if (windows[i].banked === 0) this.lastSeen.banked.delete(hit.key);
    });
    return windows;
  }
}

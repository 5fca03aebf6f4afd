import type { RateLimitConsumption, RateLimitHit } from '../store/rate-limit-store.js';

/**
 * What Redis last said about a key: units used, under which limit (a changed limit changes the
 * count, not a loss), and when its window resets (on this instance's clock, read after the reply:
 * a stalled event loop delays it by the stall); `resetAt` stays as first seen for the whole window,
 * which it names. `admitted`: units this instance admitted in that window. `guessed`: a window
 * Redis has not reported on, which the fallback started when it first decided the key.
 */
export type LastSeen = {
  used: number;
  limit: number;
  resetAt: number;
  admitted: number;
  guessed: boolean;
  /** Until when a `blockFor` penalty started here refuses the key (0: none). */
  blockedUntil: number;
  /**
   * Units Redis admitted in this window, late, for requests this instance had already refused at
   * their deadline (`reconcile`): Redis counted them and no client had them, so a request decided
   * here may take them, within the limit whatever the others admitted.
   */
  banked: number;
  /** When this instance last heard of the window (its clock), and the first time, with the count then. */
  at: number;
  since: number;
  sinceUsed: number;
  /** Units per ms the key's count grew, all instances together, as this instance heard it (0: not known). */
  rate: number;
  /**
   * The share of this window this instance took while Redis was out: it holds, Redis answering
   * again or not, until `heldUntil` (`holdsShares`).
   */
  held?: number;
  heldUntil?: number;
  /** What the other instances admitted since this one last heard, estimated at the first local decision. */
  others?: number;
};

/**
 * What Redis last said of each active key: what the local fallback decides from. The resilient
 * store fills it from every answer (`ReportedWindows`, in `resilient-store.ts`: the code each
 * request runs stays in that one file); the fallback, which knows it by this interface, reads it
 * and moves it on while it decides.
 */
export interface LastSeenKeys {
  get(key: string): LastSeen | undefined;
  set(key: string, seen: LastSeen): void;
  delete(key: string): void;
  /** Keys whose window has units banked (`BankedUnits.reconcile`): none, and nothing is looked up per request. */
  readonly banked: Set<string>;
  /** Notes what Redis reported for each hit of a request, on time or late. */
  remember(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number): void;
  /** How far apart two reports of one window's end may be and still name it. */
  matchMs(hit: RateLimitHit): number;
}

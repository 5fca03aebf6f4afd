import type { RateLimitHit, RateLimitReceipt, RateLimitRefund } from '../store/rate-limit-store.js';
import type { LastSeenKeys } from './last-seen.js';
import type { UnitsToRecord } from './pending-units.js';

/**
 * The receipt of a `settleCost` admission, or of a cap's slot, the local fallback decided while the
 * store was out: its settlement (the real cost less the reservation; the slot given back) is counted
 * where the fallback counted the admission, in its window here and with the units it records in the
 * store once that answers, so the count there ends as the sum of the real costs, and a slot given
 * back during the outage is never recorded. The store never sees such a receipt.
 */
export interface FallbackReceipt extends RateLimitReceipt {
  readonly fallback: true;
  /** When the fallback's window the admission was counted in ends (this process's clock). */
  readonly windowEndsAt: number;
  /**
   * Whether the reservation waits to be recorded in the store (its call never reached it): only
   * then can a refund be taken off what is recorded. One that may have run there stays counted.
   */
  readonly recorded: boolean;
}

/** Fallback admissions hold nothing in flight in the store: one nonce for all, never sent. */
const FALLBACK_NONCE = 'fallback';

/**
 * Receipts of an admission the fallback decided, one per hit of a `settleCost` rule or a cap (none
 * for the others, which have nothing to settle); undefined when no hit has one.
 * @param windowEndsAt per hit, the end of the window it was counted in.
 */
export function fallbackReceipts(
  hits: readonly RateLimitHit[],
  windowEndsAt: readonly number[],
  recorded: boolean,
  now: number,
): RateLimitReceipt[] | undefined {
  let receipts: RateLimitReceipt[] | undefined;
  hits.forEach((hit, i) => {
    if (hit.overdraftBound === undefined && !hit.slot) return;
    receipts ??= [];
    const receipt: FallbackReceipt = {
      admittedAt: now,
      nonce: FALLBACK_NONCE,
      fallback: true,
      windowEndsAt: windowEndsAt[i],
      recorded,
    };
    receipts[i] = receipt;
  });
  return receipts;
}

export function isFallbackReceipt(receipt: RateLimitReceipt): receipt is FallbackReceipt {
  return (receipt as Partial<FallbackReceipt>).fallback === true;
}

/**
 * Splits settlements (or charges) into those of admissions the fallback decided, settled by
 * `local` (the units: positive charged, negative refunded), and the rest, returned for the store.
 */
export function settleFallbackAdmissions<T extends RateLimitRefund>(
  settlements: readonly T[],
  units: (settlement: T) => number,
  local: (hit: RateLimitHit, units: number, receipt: FallbackReceipt) => void,
): readonly T[] {
  if (!settlements.some(({ receipt }) => isFallbackReceipt(receipt))) return settlements;
  const rest: T[] = [];
  for (const settlement of settlements) {
    if (isFallbackReceipt(settlement.receipt)) local(settlement.hit, units(settlement), settlement.receipt);
    else rest.push(settlement);
  }
  return rest;
}

/**
 * A `settleCost` admission the fallback decided cost `units` more than it reserved (fewer, if
 * negative): counted in its window here, and with the units to record in the store. An overdraft
 * is recorded whatever became of the reservation (the store never heard of it); a refund comes off
 * only a reservation that waits to be recorded, while it waits (one recorded, or that may have run
 * in the store, stays counted: the safe side).
 */
export function settleInFallback(
  fallback: { readonly lastSeen: LastSeenKeys; readonly pending: UnitsToRecord },
  hit: RateLimitHit,
  units: number,
  receipt: FallbackReceipt,
  now: number,
): void {
  const { lastSeen, pending } = fallback;
  const { windowEndsAt } = receipt;
  const seen = lastSeen.get(hit.key);
  if (seen && Math.abs(seen.resetAt - windowEndsAt) <= lastSeen.matchMs(hit)) {
    seen.admitted = Math.max(0, seen.admitted + units);
  }
  if (windowEndsAt <= now || units === 0) return;
  if (units > 0) {
    pending.add({ ...hit, cost: units }, windowEndsAt, now);
    return;
  }
  const waiting = receipt.recorded ? pending.get(hit.key) : undefined;
  if (!waiting || waiting.until <= now) return;
  const left = waiting.hit.cost + units;
  if (left > 0) waiting.hit = { ...waiting.hit, cost: left };
  else pending.delete(hit.key);
}

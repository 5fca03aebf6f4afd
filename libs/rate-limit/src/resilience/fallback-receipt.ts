import type { RateLimitHit, RateLimitReceipt, RateLimitRefund } from '../store/rate-limit-store.js';

/**
 * The receipt of a `settleCost` admission the local fallback decided while the store was out: its
 * settlement (the real cost less the reservation) is counted where the fallback counted the
 * reservation, in its window here and with the units it records in the store once that answers,
 * so the count there ends as the sum of the real costs. The store never sees such a receipt.
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
 * Receipts of an admission the fallback decided, one per hit of a `settleCost` rule (none for the
 * others, which have nothing to settle); undefined when no hit has one.
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
    if (hit.overdraftBound === undefined) return;
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

import { randomBytes } from 'node:crypto';
import calculateSlot from 'cluster-key-slot';
import type { RateLimitDecision, RateLimitHit, RateLimitReceipt } from '../store/rate-limit-store.js';

/*
 * How the Redis store divides a request's keys into calls, and ties those calls together. On
 * Cluster a call's keys must share a hash slot: one call per slot (the keys of one identity always
 * share one, by their hash tag); on a standalone server every key goes in one call. The calls of
 * one request share a nonce.
 */

/**
 * Unique per process; with the process's call sequence it makes every request's nonce unique. The
 * sequence is the process's, not a store's: two stores in one process (two apps, or a test's
 * instances) must not hand out the same nonce, which would merge two sliding-log admissions made
 * in the same ms into one member.
 */
const PROCESS_NONCE = randomBytes(6).toString('base64url');
let sequence = 0;

/** A nonce no other request of any store in this process has. */
export function nextNonce(): string {
  return `${PROCESS_NONCE}${(sequence++).toString(36)}`;
}

/** The routing of every key the store writes, reads or refunds: one function, one answer. */
export function slotOf(key: string, cluster: boolean): number {
  return cluster ? calculateSlot(key) : 0;
}

/** Indices of keys grouped by hash slot; everything in one group on a standalone server. */
export function groupBySlot(keys: readonly string[], cluster: boolean): number[][] {
  if (keys.length === 1) return [[0]];
  if (!cluster) return [keys.map((_, i) => i)];
  const bySlot = new Map<number, number[]>();
  keys.forEach((key, i) => {
    const slot = calculateSlot(key);
    const group = bySlot.get(slot);
    if (group) group.push(i);
    else bySlot.set(slot, [i]);
  });
  return [...bySlot.values()];
}

/**
 * Whether the hits' keys share one Cluster slot (one call), without grouping them: the fast path
 * asks. (A standalone server takes any keys in one call.)
 */
export function inOneSlot(hits: readonly RateLimitHit[]): boolean {
  if (hits.length === 1) return true;
  const slot = calculateSlot(hits[0].key);
  return hits.every((hit) => calculateSlot(hit.key) === slot);
}

/** `groupBySlot` of the hits' keys. */
export function groupHitsBySlot(hits: readonly RateLimitHit[], cluster: boolean): number[][] {
  return groupBySlot(
    hits.map((hit) => hit.key),
    cluster,
  );
}

/** What one call (one slot's hits) decided. */
export interface GroupResult {
  indices: readonly number[];
  allowed: boolean;
  decisions: RateLimitDecision[];
  /** What a refund of each hit needs, if the request is admitted. */
  receipts: RateLimitReceipt[];
  /** Each hit's window start on Redis's clock (or the given `now`'s). */
  windowStarts: number[];
  /** The time each hit was decided at, on the same clock. */
  decidedAt: number[];
  /** Recorded units (`record`) each hit left out: Redis holds a window that started after theirs. */
  unrecorded?: boolean[];
}

/** The calls of one request put back in hit order: admitted only if every call admitted. */
export function mergeGroups(results: readonly GroupResult[]) {
  const decisions: RateLimitDecision[] = [];
  const receipts: RateLimitReceipt[] = [];
  const windowStarts: number[] = [];
  const decidedAt: number[] = [];
  for (const result of results) {
    result.indices.forEach((hitIndex, i) => {
      decisions[hitIndex] = result.decisions[i];
      receipts[hitIndex] = result.receipts[i];
      windowStarts[hitIndex] = result.windowStarts[i];
      decidedAt[hitIndex] = result.decidedAt[i];
    });
  }
  return { allowed: results.every((result) => result.allowed), decisions, receipts, windowStarts, decidedAt };
}

import { randomBytes } from 'node:crypto';
import { Cluster } from 'ioredis';
import calculateSlot from 'cluster-key-slot';
import { CONSUME_SCRIPT, RAISE_FIXED_WINDOW_SCRIPT, REFUND_SCRIPT } from './scripts/consume.script.js';
import type { RedisService } from './redis.service.js';
import { UnsentCallsError, neverReachedRedis } from './unsent-error.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitReceipt,
  type RateLimitSettlement,
  RateLimitStore,
} from '../store/rate-limit-store.js';

/** Unique per process; with a per-call sequence it makes every request's nonce unique. */
const PROCESS_NONCE = randomBytes(6).toString('base64url');

interface GroupResult {
  indices: readonly number[];
  allowed: boolean;
  admittedAt: number;
  decisions: RateLimitDecision[];
}

/**
 * Counters in Redis, shared by every instance. All rules of a request go in one Lua call. On
 * Cluster, a call's keys must share a hash slot: hits are grouped by slot (keys of one identity
 * always share one), one call per group, and when one group rejects, the groups that admitted are
 * refunded, so a rejected request still moves no counter.
 */
export class RedisRateLimitStore extends RateLimitStore {
  readonly description: string;
  private sequence = 0;

  constructor(
    private readonly redis: RedisService,
    private readonly waitForReplicas: { replicas: number; timeoutMs: number } | false = false,
  ) {
    super();
    redis.register(CONSUME_SCRIPT);
    redis.register(REFUND_SCRIPT);
    redis.register(RAISE_FIXED_WINDOW_SCRIPT);
    this.description = `Redis store (${redis.describe()}; shared across instances)`;
  }

  async consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    const nonce = `${PROCESS_NONCE}${(this.sequence++).toString(36)}`;
    // Whole milliseconds: the scripts' replies and sorted-set members carry no fractions.
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = this.groupBySlot(hits);
    const settled = await Promise.allSettled(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce)));
    const failures = settled.flatMap((result) => (result.status === 'rejected' ? [result.reason as unknown] : []));
    if (failures.length > 0 && groups.length > 1) {
      // Some slot failed: take back what the others admitted, then let onStoreError decide.
      const admitted = settled.flatMap((result) =>
        result.status === 'fulfilled' && result.value.allowed ? [result.value] : [],
      );
      const refunded = await this.refundGroups(hits, admitted, nonce);
      // Nothing of this request is left in Redis only if no failed call was sent and every refund
      // landed; otherwise report a failure that may have run, so nothing counts it again.
      const mayHaveRun = failures.find((failure) => !neverReachedRedis(failure));
      if (mayHaveRun !== undefined) throw mayHaveRun;
      if (!refunded) throw new Error(`Refunding Cluster slots failed after: ${String(failures[0])}`);
      throw new UnsentCallsError(String(failures[0]));
    }
    if (failures.length > 0) throw failures[0];
    const results = settled.map((result) => (result as PromiseFulfilledResult<GroupResult>).value);
    const allowed = results.every((result) => result.allowed);
    const decisions: RateLimitDecision[] = [];
    const receipts: RateLimitReceipt[] = [];
    const decidedAt: number[] = [];
    for (const result of results) {
      result.indices.forEach((hitIndex, i) => {
        decisions[hitIndex] = result.decisions[i];
        receipts[hitIndex] = { admittedAt: result.admittedAt, nonce };
        decidedAt[hitIndex] = result.admittedAt;
      });
    }
    if (!allowed && results.length > 1) {
      await this.refundGroups(
        hits,
        results.filter((result) => result.allowed),
        nonce,
      );
    }
    let replicated: boolean | undefined;
    if (allowed && this.waitForReplicas) {
      const { replicas, timeoutMs } = this.waitForReplicas;
      replicated = (await this.redis.waitForReplicas(replicas, timeoutMs).catch(() => 0)) >= replicas;
    }
    return { allowed, decisions, receipts: allowed ? receipts : undefined, decidedAt, replicated };
  }

  /**
   * Best effort: if a refund fails, those counters over-count, which errs on the safe side.
   * Resolves with whether every refund landed.
   */
  private async refundGroups(
    hits: readonly RateLimitHit[],
    groups: readonly GroupResult[],
    nonce: string,
  ): Promise<boolean> {
    const refunds = groups.flatMap((group) =>
      group.indices.map((i) => ({ hit: hits[i], receipt: { admittedAt: group.admittedAt, nonce } })),
    );
    if (refunds.length === 0) return true;
    return this.refund(refunds).then(
      () => true,
      () => false,
    );
  }

  async record(hits: readonly RateLimitHit[], now?: number): Promise<void> {
    const nonce = `${PROCESS_NONCE}${(this.sequence++).toString(36)}`;
    const at = now === undefined ? undefined : Math.floor(now);
    await Promise.all(this.groupBySlot(hits).map((indices) => this.consumeGroup(hits, indices, at, nonce, true)));
  }

  /**
   * Raises the count of the fixed window that started at `windowStart` (store time) to at least
   * `figure`, if that window is still the key's (lost-write repair).
   */
  async raiseFixedWindow(hit: RateLimitHit, windowStart: number, figure: number): Promise<void> {
    await this.redis.run(RAISE_FIXED_WINDOW_SCRIPT, [hit.key], [windowStart, figure]);
  }

  async settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    // One call per slot and admission (a request's hits share one nonce; slots may differ in time).
    const byCall = new Map<string, RateLimitSettlement[]>();
    for (const settlement of settlements) {
      const { hit, receipt } = settlement;
      const id = `${this.slotOf(hit.key)}|${receipt.admittedAt}|${receipt.nonce}`;
      const group = byCall.get(id);
      if (group) group.push(settlement);
      else byCall.set(id, [settlement]);
    }
    await Promise.all(
      [...byCall.values()].map((group) => {
        const { admittedAt, nonce } = group[0].receipt;
        const keys: string[] = [];
        const args: (string | number)[] = [admittedAt, nonce, group.length];
        for (const { hit, refund } of group) {
          keys.push(hit.key, hit.pendingKey);
          args.push(hit.algorithm, hit.limit, hit.windowMs, hit.cost, hit.burst, refund ? 1 : 0);
        }
        return this.redis.run(REFUND_SCRIPT, keys, args);
      }),
    );
  }

  private async consumeGroup(
    hits: readonly RateLimitHit[],
    indices: readonly number[],
    now: number | undefined,
    nonce: string,
    record = false,
  ): Promise<GroupResult> {
    const keys: string[] = [];
    const args: (string | number)[] = [now ?? -1, nonce, indices.length];
    for (const i of indices) {
      const hit = hits[i];
      keys.push(hit.key, hit.blockKey, hit.markerKey, hit.pendingKey);
      args.push(
        hit.algorithm,
        hit.limit,
        hit.windowMs,
        hit.cost,
        hit.burst,
        hit.blockMs,
        record ? 1 : 0,
        hit.markFrom,
        hit.conditional && !record ? 1 : 0,
      );
    }
    const reply = (await this.redis.run(CONSUME_SCRIPT, keys, args)) as number[];
    return {
      indices,
      allowed: reply[0] === 1,
      admittedAt: reply[1],
      decisions: indices.map((hitIndex, i) => {
        const at = 2 + i * 4;
        const decision: RateLimitDecision = {
          allowed: reply[at] === 1,
          limit: hits[hitIndex].limit,
          remaining: reply[at + 1],
          resetMs: reply[at + 2],
        };
        // Set only when true, so decisions compare equal to the memory store's.
        if (reply[at + 3] & 1) decision.provisional = true;
        if (reply[at + 3] & 2) decision.repaired = true;
        return decision;
      }),
    };
  }

  /** Indices of hits grouped by hash slot; everything in one group on a standalone server. */
  private groupBySlot(hits: readonly RateLimitHit[]): number[][] {
    if (hits.length === 1) return [[0]];
    const bySlot = new Map<number, number[]>();
    hits.forEach((hit, i) => {
      const slot = this.slotOf(hit.key);
      const group = bySlot.get(slot);
      if (group) group.push(i);
      else bySlot.set(slot, [i]);
    });
    return [...bySlot.values()];
  }

  /** The routing of every key the store writes, reads or refunds: one function, one answer. */
  private slotOf(key: string): number {
    return this.redis.client instanceof Cluster ? calculateSlot(key) : 0;
  }
}

import { randomBytes } from 'node:crypto';
import { Cluster } from 'ioredis';
import calculateSlot from 'cluster-key-slot';
import { CONSUME_SCRIPT, RAISE_FIXED_WINDOW_SCRIPT, REFUND_SCRIPT } from '../redis/consume.script.js';
import type { RedisService } from '../redis/redis.service.js';
import { UnsentCallsError, neverReachedRedis } from '../redis/unsent-error.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitReceipt,
  type RateLimitRefund,
  RateLimitStore,
} from './rate-limit-store.js';

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

  async refund(refunds: readonly RateLimitRefund[]): Promise<void> {
    // One call per slot and admission (a request's hits share one nonce; slots may differ in time).
    const byCall = new Map<string, RateLimitRefund[]>();
    for (const refund of refunds) {
      const id = `${this.slotOf(refund.hit.key)}|${refund.receipt.admittedAt}|${refund.receipt.nonce}`;
      const group = byCall.get(id);
      if (group) group.push(refund);
      else byCall.set(id, [refund]);
    }
    await Promise.all(
      [...byCall.values()].map((group) => {
        const { admittedAt, nonce } = group[0].receipt;
        const args: (string | number)[] = [admittedAt, nonce, group.length];
        for (const { hit } of group) args.push(hit.algorithm, hit.limit, hit.windowMs, hit.cost, hit.burst);
        return this.redis.run(
          REFUND_SCRIPT,
          group.map(({ hit }) => hit.key),
          args,
        );
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
      keys.push(hit.key, hit.blockKey, hit.markerKey);
      args.push(hit.algorithm, hit.limit, hit.windowMs, hit.cost, hit.burst, hit.blockMs, record ? 1 : 0, hit.markFrom);
    }
    const reply = (await this.redis.run(CONSUME_SCRIPT, keys, args)) as number[];
    return {
      indices,
      allowed: reply[0] === 1,
      admittedAt: reply[1],
      decisions: indices.map((hitIndex, i) => ({
        allowed: reply[2 + i * 3] === 1,
        limit: hits[hitIndex].limit,
        remaining: reply[3 + i * 3],
        resetMs: reply[4 + i * 3],
      })),
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

import { randomBytes } from 'node:crypto';
import { Cluster } from 'ioredis';
import calculateSlot from 'cluster-key-slot';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitReceipt,
  type RateLimitSettlement,
  RateLimitStore,
} from '../store/rate-limit-store.js';
import type { LostWriteCheck, LostWriteRepairs } from './failover/lost-write-check.js';
import type { ReplicaWait } from './failover/replica-wait.js';
import type { RedisService } from './redis.service.js';
import { CONSUME_SCRIPT, decodeConsume, encodeConsume } from './scripts/consume.script.js';
import { RAISE_FIXED_WINDOW_SCRIPT, encodeRaiseFixedWindow } from './scripts/raise-fixed-window.script.js';
import { REFUND_SCRIPT, encodeRefund } from './scripts/refund.script.js';
import { RESET_SCRIPT, encodeReset } from './scripts/reset.script.js';
import { UnsentCallsError, neverReachedRedis } from './unsent-error.js';

/** Unique per process; with a per-call sequence it makes every request's nonce unique. */
const PROCESS_NONCE = randomBytes(6).toString('base64url');

/** The failover defences of a Redis store (see `redis/failover/`), each optional. */
export interface RedisFailoverDefences {
  /** Checks each fixed window against what this instance saw in it. */
  lostWrites?: LostWriteCheck;
  /** The lost-write marker's share of the limit, or false for none. */
  marker: number | false;
  /** Redis `WAIT` after each admission. */
  replicaWait?: ReplicaWait;
}

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
 * refunded, so a rejected request still moves no counter. The failover defences run here, the
 * only place that sees Redis's own time of each decision.
 */
export class RedisRateLimitStore extends RateLimitStore implements LostWriteRepairs {
  readonly description: string;
  private sequence = 0;
  private readonly markerShare: number | false;
  private readonly lostWrites: LostWriteCheck | undefined;
  private readonly replicaWait: ReplicaWait | undefined;

  constructor(
    private readonly redis: RedisService,
    private readonly problems: StoreProblemLog,
    defences: RedisFailoverDefences,
  ) {
    super();
    for (const script of [CONSUME_SCRIPT, REFUND_SCRIPT, RAISE_FIXED_WINDOW_SCRIPT, RESET_SCRIPT]) {
      redis.register(script);
    }
    this.markerShare = defences.marker;
    this.lostWrites = defences.lostWrites;
    this.replicaWait = defences.replicaWait;
    this.description = `Redis store (${redis.describe()}; shared across instances)`;
  }

  async consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    const nonce = this.nextNonce();
    // Whole milliseconds: the scripts' replies and sorted-set members carry no fractions.
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = this.groupBySlot(hits.map((hit) => hit.key));
    const settled = await Promise.allSettled(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce)));
    const failures = settled.flatMap((result) => (result.status === 'rejected' ? [result.reason as unknown] : []));
    if (failures.length > 0 && groups.length > 1) {
      // Some slot failed: take back what the others admitted, then let the store-error policies decide.
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
    let consumption: RateLimitConsumption = { allowed, decisions, receipts: allowed ? receipts : undefined };
    if (this.lostWrites) consumption = await this.lostWrites.check(hits, consumption, decidedAt, this);
    if (consumption.allowed && this.replicaWait) await this.replicaWait.afterAdmission();
    return consumption;
  }

  override neverReached(error: unknown): boolean {
    return neverReachedRedis(error);
  }

  async record(hits: readonly RateLimitHit[], now?: number): Promise<void> {
    const nonce = this.nextNonce();
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = this.groupBySlot(hits.map((hit) => hit.key));
    await Promise.all(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce, true)));
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
        const { keys, args } = encodeRefund(admittedAt, nonce, group);
        return this.redis.run(REFUND_SCRIPT, keys, args);
      }),
    );
  }

  async reset(keys: readonly string[]): Promise<void> {
    this.lostWrites?.forget(keys);
    await Promise.all(
      this.groupBySlot(keys).map((indices) =>
        this.redis.run(RESET_SCRIPT, encodeReset(indices.map((i) => keys[i])), []),
      ),
    );
  }

  /**
   * Raises the count of the fixed window that started at `windowStart` (store time) to at least
   * `figure`, if that window is still the key's (lost-write repair).
   */
  async raiseFixedWindow(hit: RateLimitHit, windowStart: number, figure: number): Promise<void> {
    const { keys, args } = encodeRaiseFixedWindow(hit.key, windowStart, figure);
    await this.redis.run(RAISE_FIXED_WINDOW_SCRIPT, keys, args);
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

  private async consumeGroup(
    hits: readonly RateLimitHit[],
    indices: readonly number[],
    now: number | undefined,
    nonce: string,
    record = false,
  ): Promise<GroupResult> {
    const group = indices.map((i) => hits[i]);
    const { keys, args } = encodeConsume({ now, nonce, hits: group, record, markerShare: this.markerShare });
    const reply = decodeConsume(await this.redis.run(CONSUME_SCRIPT, keys, args), group.length);
    return {
      indices,
      allowed: reply.allowed,
      admittedAt: reply.now,
      decisions: reply.rules.map((rule, i) => {
        if (rule.repaired) {
          this.problems.report(
            `repaired:${group[i].key.replace(/\{[^}]*\}/, '{}')}`,
            `Mended a key found corrupt or without a TTL (${group[i].key}, among others)`,
          );
        }
        const decision: RateLimitDecision = {
          allowed: rule.allowed,
          limit: group[i].limit,
          remaining: rule.remaining,
          resetMs: rule.resetMs,
        };
        // Set only when true, so decisions compare equal to the memory store's.
        if (rule.provisional) decision.provisional = true;
        return decision;
      }),
    };
  }

  private nextNonce(): string {
    return `${PROCESS_NONCE}${(this.sequence++).toString(36)}`;
  }

  /** Indices of keys grouped by hash slot; everything in one group on a standalone server. */
  private groupBySlot(keys: readonly string[]): number[][] {
    if (keys.length === 1) return [[0]];
    const bySlot = new Map<number, number[]>();
    keys.forEach((key, i) => {
      const slot = this.slotOf(key);
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

import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitRefund,
  type RateLimitSettlement,
  givenBack,
  holdsInFlight,
} from '../store/rate-limit-store.js';
import type { DecisionTimes } from './failover/lost-write-check.js';
import type { ScriptRunner } from './script-runner.js';
import { type GroupResult, groupHitsBySlot, mergeGroups, nextNonce, slotOf } from './call-grouping.js';
import { RedisTimeoutError } from './redis-timeout.js';
import { CONSUME_SCRIPTS, decodeConsume, encodeConsume } from './scripts/consume.script.js';
import { REFUND_SCRIPTS, encodeRefund } from './scripts/refund.script.js';
import { UnsentCallsError, neverReachedRedis } from './unsent-error.js';

/** What the full script decided for a request, before the failover defences, with the times they check. */
export interface SlotsDecision {
  consumption: RateLimitConsumption;
  times: DecisionTimes;
}

/**
 * The Redis store's calls of the full scripts (CONSUME_SCRIPTS, REFUND_SCRIPTS), for any hits: one
 * call per hash slot on Cluster, and when one slot rejects, the slots that admitted are refunded,
 * so a rejected request still moves no counter. Each call's answer is decoded to a `GroupResult`.
 */
export class SlotCalls {
  /**
   * @param repaired told of a key the script found corrupt or without a TTL, and mended
   * @param refund takes admitted hits back as the store does (`RateLimitStore.refund`), which tells
   *   every instance of the counts lowered
   */
  constructor(
    private readonly scripts: ScriptRunner,
    private readonly cluster: boolean,
    private readonly markerShare: number | false,
    private readonly repaired: (hit: RateLimitHit) => void,
    private readonly refund: (refunds: readonly RateLimitRefund[]) => Promise<void>,
  ) {}

  /** A request's consumption by the full script, one call per slot. */
  async consume(hits: readonly RateLimitHit[], now: number | undefined): Promise<SlotsDecision> {
    const nonce = nextNonce();
    // Whole milliseconds: the scripts' replies and sorted-set members carry no fractions.
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = groupHitsBySlot(hits, this.cluster);
    if (groups.length === 1) {
      // Every key in one slot (always on a standalone server): one call, its results in hit order.
      const result = await this.consumeGroup(hits, groups[0], at, nonce);
      const { allowed, decisions, receipts, windowStarts, decidedAt } = result;
      return {
        consumption: { allowed, decisions, receipts: allowed ? receipts : undefined },
        times: { at: decidedAt, windowStarts },
      };
    }
    const settled = await Promise.allSettled(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce)));
    const failures = settled.flatMap((result) => (result.status === 'rejected' ? [result.reason as unknown] : []));
    if (failures.length > 0 && groups.length > 1) {
      // Some slot failed: take back what the others admitted, then let the store-error policies decide.
      const admitted = settled.flatMap((result) =>
        result.status === 'fulfilled' && result.value.allowed ? [result.value] : [],
      );
      const refunded = await this.refundGroups(hits, admitted);
      // Nothing of this request is left in Redis only if no failed call was sent and every refund
      // landed; otherwise report a failure that may have run, so nothing counts it again.
      const mayHaveRun = failures.find((failure) => !neverReachedRedis(failure));
      if (mayHaveRun !== undefined) throw mayHaveRun;
      if (!refunded) throw new Error(`Refunding Cluster slots failed after: ${String(failures[0])}`);
      throw new UnsentCallsError(String(failures[0]));
    }
    if (failures.length > 0) throw failures[0];
    const results = settled.map((result) => (result as PromiseFulfilledResult<GroupResult>).value);
    const { allowed, decisions, receipts, windowStarts, decidedAt } = mergeGroups(results);
    if (!allowed) {
      await this.refundGroups(
        hits,
        results.filter((result) => result.allowed),
      );
    }
    return {
      consumption: { allowed, decisions, receipts: allowed ? receipts : undefined },
      times: { at: decidedAt, windowStarts },
    };
  }

  /** Counts units without deciding (`RateLimitStore.record`): one call per slot, each slot's result. */
  record(hits: readonly RateLimitHit[], now: number | undefined): Promise<GroupResult[]> {
    const nonce = nextNonce();
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = groupHitsBySlot(hits, this.cluster);
    return Promise.all(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce, true)));
  }

  /** Ends admitted hits, announcing nothing. */
  async settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    // One call per slot and admission (a request's hits share one nonce; slots may differ in time).
    const byCall = new Map<string, RateLimitSettlement[]>();
    for (const settlement of settlements) {
      const { hit, receipt } = settlement;
      const id = `${slotOf(hit.key, this.cluster)}|${receipt.admittedAt}|${receipt.nonce}`;
      const group = byCall.get(id);
      if (group) group.push(settlement);
      else byCall.set(id, [settlement]);
    }
    await Promise.all(
      [...byCall.values()].map((group) => {
        const { admittedAt, nonce } = group[0].receipt;
        const { keys, args } = encodeRefund(admittedAt, nonce, group);
        return this.scripts.run(REFUND_SCRIPTS.for(group.map(({ hit }) => hit)), keys, args);
      }),
    );
  }

  /** A late answer of the full script to hits of one slot, decoded as `consume` would. */
  decodeLate(hits: readonly RateLimitHit[], reply: unknown): RateLimitConsumption {
    const { allowed, decisions } = this.groupResult(hits, [], reply, undefined, '');
    return { allowed, decisions, receipts: undefined };
  }

  /**
   * Best effort: if a refund fails, those counters over-count, which errs on the safe side.
   * Resolves with whether every refund landed.
   */
  private async refundGroups(hits: readonly RateLimitHit[], groups: readonly GroupResult[]): Promise<boolean> {
    const refunds = groups.flatMap((group) =>
      group.indices.map((hitIndex, i) => ({ hit: hits[hitIndex], receipt: group.receipts[i] })),
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
    const call = { now, nonce, hits: group, record, sentAt: now ?? Date.now(), markerShare: this.markerShare };
    const { keys, args } = encodeConsume(call);
    let answer: unknown;
    try {
      answer = await this.scripts.run(CONSUME_SCRIPTS.for(group), keys, args);
    } catch (error) {
      if (!record && error instanceof RedisTimeoutError && error.answer && group.some(holdsInFlight)) {
        void error.answer.then((late) => this.endLateInFlight(group, late, now, nonce)).catch(() => undefined);
      }
      throw error;
    }
    return this.groupResult(group, indices, answer, now, nonce);
  }

  /**
   * A call past its deadline that Redis admitted all the same: the request was decided without it,
   * so no settlement of its will come. What it holds in flight (`countOn` units, a `settleCost`
   * claim) ends here, its units kept; left, it would weigh on the identity for a window. A cap's
   * slot is given back: no request holds it, and kept it would refuse others for its whole lease.
   */
  private async endLateInFlight(
    group: readonly RateLimitHit[],
    late: unknown,
    now: number | undefined,
    nonce: string,
  ): Promise<void> {
    const { allowed, receipts } = this.groupResult(group, [], late, now, nonce);
    if (!allowed) return;
    await this.settle(
      group.flatMap((hit, i) => (holdsInFlight(hit) ? [{ hit, receipt: receipts[i], refund: givenBack(hit) }] : [])),
    );
  }

  /** What the full script answered for one slot's hits (`group`, at `indices` of the request). */
  private groupResult(
    group: readonly RateLimitHit[],
    indices: readonly number[],
    answer: unknown,
    now: number | undefined,
    nonce: string,
  ): GroupResult {
    const reply = decodeConsume(answer, group.length);
    const decisions = reply.rules.map((rule, i): RateLimitDecision => {
      if (rule.repaired) this.repaired(group[i]);
      const decision: RateLimitDecision = {
        allowed: rule.allowed,
        limit: group[i].limit,
        remaining: rule.remaining,
        resetMs: rule.resetMs,
      };
      // Set only when true, so decisions compare equal to the memory store's.
      if (rule.provisional) decision.provisional = true;
      return decision;
    });
    const admittedAt = reply.now;
    const windowStarts = group.map((hit, i) => admittedAt + decisions[i].resetMs - hit.windowMs);
    return {
      indices,
      allowed: reply.allowed,
      decisions,
      windowStarts,
      decidedAt: group.map(() => admittedAt),
      unrecorded: reply.rules.map((rule) => rule.unrecorded),
      // A fixed window on Redis's clock keeps no start in its key: its receipt names the window,
      // so a refund goes into that window only.
      receipts: group.map((hit, i) =>
        now === undefined && hit.algorithm === 'fixed-window'
          ? { admittedAt, nonce, windowStart: windowStarts[i] }
          : { admittedAt, nonce },
      ),
    };
  }
}

import type { StoreProblemLog } from '../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type LiftedKeysWatcher,
  type RateLimitRefund,
  type RateLimitSettlement,
  type RateLimitStanding,
  RateLimitStore,
  capacityOf,
  holdsInFlight,
} from '../store/rate-limit-store.js';
import { INSPECT_LAYOUT, INSPECT_SCRIPTS, encodeInspect } from './scripts/inspect.script.js';
import type { DecisionTimes, LostWriteCheck, LostWriteRepairs } from './failover/lost-write-check.js';
import type { ReplicaWait } from './failover/replica-wait.js';
import type { RedisService } from './redis.service.js';
import type { ScriptRunner } from './script-runner.js';
import {
  type GroupResult,
  groupBySlot,
  groupHitsBySlot,
  inOneSlot,
  mergeGroups,
  nextNonce,
  slotOf,
} from './call-grouping.js';
import { isCluster } from './is-cluster.js';
import { CONSUME_SCRIPTS, decodeConsume, encodeConsume } from './scripts/consume.script.js';
import { FIXED_WINDOW_FAST_SCRIPT, decodeFast, encodeFast, isFastHit } from './scripts/fixed-window-fast.script.js';
import { type LostWriteRaise, RAISE_SCRIPTS, encodeRaise } from './scripts/raise.script.js';
import { REFUND_SCRIPTS, encodeRefund } from './scripts/refund.script.js';
import { RESET_SCRIPT, encodeReset } from './scripts/reset.script.js';
import { UnsentCallsError, neverReachedRedis } from './unsent-error.js';
import { RedisTimeoutError } from './call-safety.js';

/** The failover defences of a Redis store (see `redis/failover/`), each optional. */
export interface RedisFailoverDefences {
  /** Checks each state against the least it can hold by what this instance saw of it. */
  lostWrites?: LostWriteCheck;
  /** The lost-write marker's share of the limit, or false for none. */
  marker: number | false;
  /** Redis `WAIT` after each admission. */
  replicaWait?: ReplicaWait;
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
  private readonly markerShare: number | false;
  private lostWrites: LostWriteCheck | undefined;
  private readonly replicaWait: ReplicaWait | undefined;
  /** Runs the scripts: deadline, breaker, one write per turn of the event loop. */
  private readonly scripts: ScriptRunner;
  /** Whether calls may take FIXED_WINDOW_FAST_SCRIPT: not with the marker, which the full script writes. */
  private readonly fast: boolean;

  constructor(
    private readonly redis: RedisService,
    private readonly problems: StoreProblemLog,
    defences: RedisFailoverDefences,
  ) {
    super();
    // Loaded on every (re)connect: these from the start, and each variant by algorithms once a call
    // first needs it (`ScriptRunner.run` loads it before that call).
    this.scripts = redis.runner;
    for (const script of [FIXED_WINDOW_FAST_SCRIPT, RESET_SCRIPT]) this.scripts.register(script);
    this.markerShare = defences.marker;
    if (defences.lostWrites) this.checkLostWrites(defences.lostWrites);
    this.replicaWait = defences.replicaWait;
    this.fast = this.markerShare === false;
    this.description = `Redis store (${redis.describe()}; shared across instances)`;
  }

  /**
   * @internal Turns the lost-write check on from now (`failover.detectLostWrites: 'auto'` does once
   * a replica can be promoted; `LostWriteCheckSwitch`). Until then no request pays for it.
   */
  checkLostWrites(lostWrites: LostWriteCheck): void {
    if (this.lostWrites) return;
    this.lostWrites = lostWrites;
    // A key another instance reset or refunded is no loss to repair here either. (News that may have
    // been missed forgets nothing: a failover, when the check matters most, cuts it off.)
    this.redis.news.watchLiftedKeys({ lifted: (keys) => lostWrites.forget(keys), listening: () => undefined });
  }

  override inspect(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitStanding[]> {
    const at = now === undefined ? undefined : Math.floor(now);
    // One call per hit: an operator's read, where keys of several slots need no atomicity.
    return Promise.all(
      hits.map(async (hit) => {
        const { keys, args } = encodeInspect([hit], at, this.markerShare);
        const reply = INSPECT_LAYOUT.decode(await this.scripts.runOperation(INSPECT_SCRIPTS.for([hit]), keys, args), 1);
        const { remaining, reset, blocked } = reply.rules[0];
        return { remaining, resetMs: remaining >= capacityOf(hit) ? 0 : reset, blockedMs: blocked };
      }),
    );
  }

  consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    if (this.fast && now === undefined && this.allFast(hits)) return this.consumeFast(hits);
    return this.consumeFull(hits, now);
  }

  /** Whether FIXED_WINDOW_FAST_SCRIPT can decide these hits in one call (one slot on Cluster). */
  private allFast(hits: readonly RateLimitHit[]): boolean {
    for (const hit of hits) if (!isFastHit(hit)) return false;
    return inOneSlot(hits, this.cluster);
  }

  /** One FIXED_WINDOW_FAST_SCRIPT call; the full script when it asks for it (a key to repair). */
  private consumeFast(hits: readonly RateLimitHit[]): Promise<RateLimitConsumption> {
    const { keys, args } = encodeFast(hits);
    return this.scripts.run(FIXED_WINDOW_FAST_SCRIPT, keys, args).then((answer) => {
      const consumption = decodeFast(answer, hits, this.reportRepaired);
      if (!consumption) return this.consumeFull(hits, undefined);
      if (!this.lostWrites && !this.replicaWait) return consumption;
      // Each window is named by its start, as the full script names it.
      const { now, decisions } = consumption;
      return this.defended(hits, consumption, {
        at: hits.map(() => now),
        windowStarts: hits.map((hit, i) => now + decisions[i].resetMs - hit.windowMs),
      });
    });
  }

  private readonly reportRepaired = (hit: RateLimitHit): void => {
    this.problems.report(
      `repaired:${hit.key.replace(/\{[^}]*\}/, '{}')}`,
      `Mended a key found corrupt or without a TTL (${hit.key}, among others)`,
    );
  };

  /** Any hits: the full script (CONSUME_SCRIPTS), one call per slot, and the failover defences. */
  private async consumeFull(hits: readonly RateLimitHit[], now: number | undefined): Promise<RateLimitConsumption> {
    const nonce = nextNonce();
    // Whole milliseconds: the scripts' replies and sorted-set members carry no fractions.
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = groupHitsBySlot(hits, this.cluster);
    if (groups.length === 1) {
      // Every key in one slot (always on a standalone server): one call, its results in hit order.
      const result = await this.consumeGroup(hits, groups[0], at, nonce);
      const { allowed, decisions, receipts, windowStarts, decidedAt } = result;
      return this.defended(
        hits,
        { allowed, decisions, receipts: allowed ? receipts : undefined },
        { at: decidedAt, windowStarts },
      );
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
    return this.defended(
      hits,
      { allowed, decisions, receipts: allowed ? receipts : undefined },
      { at: decidedAt, windowStarts },
    );
  }

  /** A consumption after the failover defences: the lost-write check, then the wait for replicas. */
  private async defended(
    hits: readonly RateLimitHit[],
    decided: RateLimitConsumption,
    times: DecisionTimes,
  ): Promise<RateLimitConsumption> {
    const consumption = this.lostWrites ? await this.lostWrites.check(hits, decided, times, this) : decided;
    if (consumption.allowed && this.replicaWait) await this.replicaWait.afterAdmission();
    return consumption;
  }

  override neverReached(error: unknown): boolean {
    return neverReachedRedis(error);
  }

  /**
   * A request's one call past its deadline: its answer, decoded as `consume` would, by the script
   * `consume` chose for these hits (every consume script is named 'consume'). A fast call whose
   * answer asked for the full script, and whose full call then timed out, decodes as neither: its
   * reply fails the fast decoding's check, and nothing is learned. Requests split over slots: none.
   */
  override lateAnswer(
    hits: readonly RateLimitHit[],
    error: unknown,
    now?: number,
  ): Promise<RateLimitConsumption> | undefined {
    if (!(error instanceof RedisTimeoutError) || !error.answer) return undefined;
    const { answer } = error;
    if (this.fast && now === undefined && this.allFast(hits)) {
      return answer.then((reply) => decodeFast(reply, hits, this.reportRepaired) ?? Promise.reject(error));
    }
    if (!inOneSlot(hits, this.cluster)) return undefined;
    return answer.then((reply) => {
      const { allowed, decisions } = this.groupResult(hits, [], reply, undefined, '');
      return { allowed, decisions, receipts: undefined };
    });
  }

  async record(hits: readonly RateLimitHit[], now?: number): Promise<void> {
    const nonce = nextNonce();
    const at = now === undefined ? undefined : Math.floor(now);
    const groups = groupHitsBySlot(hits, this.cluster);
    const results = await Promise.all(groups.map((indices) => this.consumeGroup(hits, indices, at, nonce, true)));
    if (!this.lostWrites) return;
    // Units the fallback admitted while Redis was out, recorded into a state a failover may have
    // left without the writes before them: checked as an admission is (raised back, never refused).
    // Units left out (a window started after theirs) hold nothing there to check.
    const { decisions, receipts, windowStarts, decidedAt } = mergeGroups(results);
    const left = new Set(results.flatMap((result) => result.indices.filter((_, i) => result.unrecorded?.[i])));
    const kept = (_: unknown, i: number) => !left.has(i);
    await this.lostWrites.check(
      hits.filter(kept),
      { allowed: true, decisions: decisions.filter(kept), receipts: receipts.filter(kept) },
      { at: decidedAt.filter(kept), windowStarts: windowStarts.filter(kept) },
      this,
      true,
    );
  }

  /** Refunds that announce nothing (a lost-write refusal: `LostWriteRepairs.takeBack`). */
  takeBack(refunds: readonly RateLimitRefund[]): Promise<void> {
    return this.settleQuietly(refunds.map((refund) => ({ ...refund, refund: true })));
  }

  async settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    await this.settleQuietly(settlements);
    // Counts taken back (a Cluster slot's after another refused) may admit again: every instance's
    // block cache lets them go. (`countOn` rules are never cached.)
    await this.redis.news.announceLifted(
      settlements.flatMap(({ hit, refund }) => (refund && !hit.conditional ? [hit.key] : [])),
    );
  }

  private async settleQuietly(settlements: readonly RateLimitSettlement[]): Promise<void> {
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

  async reset(keys: readonly string[]): Promise<void> {
    this.lostWrites?.forget(keys);
    await Promise.all(
      groupBySlot(keys, this.cluster).map((indices) =>
        this.scripts.run(RESET_SCRIPT, encodeReset(indices.map((i) => keys[i])), []),
      ),
    );
    // After the keys are gone; an instance forgets then, and learns no block from a call sent before.
    await this.redis.news.announceLifted(keys);
  }

  /**
   * On Cluster, the key's hash slot: a call on it answering says its master does, whichever node
   * that is after a failover.
   */
  override shardOf(key: string): string {
    return String(slotOf(key, this.cluster));
  }

  override watchLiftedKeys(watcher: LiftedKeysWatcher): boolean {
    this.redis.news.watchLiftedKeys(watcher);
    return true;
  }

  /** Raises a rule's state at a key to at least what this instance saw of it (lost-write repair). */
  async raise(raise: LostWriteRaise): Promise<void> {
    const { keys, args } = encodeRaise(raise);
    await this.scripts.run(RAISE_SCRIPTS.for([raise.hit]), keys, args);
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
   * claim) ends here, its units kept; left, it would weigh on the identity for a window.
   */
  private async endLateInFlight(
    group: readonly RateLimitHit[],
    late: unknown,
    now: number | undefined,
    nonce: string,
  ): Promise<void> {
    const { allowed, receipts } = this.groupResult(group, [], late, now, nonce);
    if (!allowed) return;
    await this.settleQuietly(
      group.flatMap((hit, i) => (holdsInFlight(hit) ? [{ hit, receipt: receipts[i], refund: false }] : [])),
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
      if (rule.repaired) this.reportRepaired(group[i]);
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

  /** Whether the client is a Cluster: calls then go one per hash slot. */
  private get cluster(): boolean {
    return isCluster(this.redis.client);
  }
}

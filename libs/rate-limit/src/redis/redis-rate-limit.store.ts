import { describeError } from '../logging/describe-error.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import {
  givenBack,
  type RateLimitConsumption,
  type RateLimitHit,
  type LiftedKeysWatcher,
  type RateLimitRefund,
  type RateLimitSettlement,
  type RateLimitStanding,
  RateLimitStore,
  capacityOf,
} from '../store/rate-limit-store.js';
import { INSPECT_LAYOUT, INSPECT_SCRIPTS, encodeInspect } from './scripts/inspect.script.js';
import type { DecisionTimes, LostWriteCheck, LostWriteRepairs } from './failover/lost-write-check.js';
import type { ReplicaWait } from './failover/replica-wait.js';
import type { RedisService } from './redis.service.js';
import type { ScriptRunner } from './script-runner.js';
import { groupBySlot, inOneSlot, mergeGroups, slotOf } from './call-grouping.js';
import { isCluster } from './is-cluster.js';
import { FIXED_WINDOW_FAST_SCRIPT, decodeFast, encodeFast, isFastHit } from './scripts/fixed-window-fast.script.js';
import { type LostWriteRaise, RAISE_SCRIPTS, encodeRaise } from './scripts/raise.script.js';
import { RENEW_SCRIPTS, decodeRenew, encodeRenew } from './scripts/renew.script.js';
import { RESET_SCRIPT, encodeReset } from './scripts/reset.script.js';
import { neverReachedRedis } from './unsent-error.js';
import { RedisTimeoutError } from './redis-timeout.js';
import { SlotCalls } from './slot-calls.js';

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
 * Counters in Redis, shared by every instance (`shared`: the module puts the block cache and the
 * local fallback in front of it, `module/limiter-provider.ts`). All rules of a request go in one Lua
 * call: fixed windows on Redis's clock in the fast script (FIXED_WINDOW_FAST_SCRIPT), the rest in
 * the full one.
 * On Cluster, a call's keys must share a hash slot: hits are grouped by slot (keys of one identity
 * always share one), one call per group (`SlotCalls`). The failover defences run here, the only
 * place that sees Redis's own time of each decision.
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
  /** Whether the client is a Cluster: calls then go one per hash slot. Told once: a client stays what it is. */
  private readonly cluster: boolean;
  /** The full scripts' calls, one per hash slot. */
  private readonly calls: SlotCalls;

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
    // `failover.marker` is false by default (`module/defaults.ts`): the fast script is the default.
    this.fast = this.markerShare === false;
    this.cluster = isCluster(redis.client);
    this.calls = new SlotCalls(this.scripts, this.cluster, this.markerShare, this.reportRepaired, (refunds) =>
      this.refund(refunds),
    );
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

  /** @param now the module's `clock`, unset by default: Redis's own time decides. */
  consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    if (this.fast && now === undefined && this.allFast(hits)) return this.consumeFast(hits);
    return this.consumeFull(hits, now);
  }

  /** Whether FIXED_WINDOW_FAST_SCRIPT can decide these hits in one call (one slot on Cluster). */
  private allFast(hits: readonly RateLimitHit[]): boolean {
    for (const hit of hits) if (!isFastHit(hit)) return false;
    return !this.cluster || inOneSlot(hits);
  }

  /** One FIXED_WINDOW_FAST_SCRIPT call; the full script when it asks for it (a key to repair). */
  private consumeFast(hits: readonly RateLimitHit[]): Promise<RateLimitConsumption> {
    const { keys, args } = encodeFast(hits);
    return this.scripts.run(FIXED_WINDOW_FAST_SCRIPT, keys, args).then((answer) => {
      const consumption = decodeFast(answer, hits, this.reportRepaired);
      if (!consumption) return this.consumeFull(hits, undefined);
      // A standalone Redis with the default options ends here: the lost-write check is on only with
      // `failover.detectLostWrites: true`, or once 'auto' (the default) sees a replica that can be
      // promoted (`LostWriteCheckSwitch`); the replica wait only with `failover.waitForReplicas`.
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
    const { consumption, times } = await this.calls.consume(hits, now);
    return this.defended(hits, consumption, times);
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
    if (this.cluster && !inOneSlot(hits)) return undefined;
    return answer.then((reply) => this.calls.decodeLate(hits, reply));
  }

  async record(hits: readonly RateLimitHit[], now?: number): Promise<void> {
    const results = await this.calls.record(hits, now);
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
    return this.calls.settle(refunds.map((refund) => ({ ...refund, refund: true })));
  }

  async settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    await this.calls.settle(settlements);
    // Counts taken back (a Cluster slot's after another refused) may admit again: every instance's
    // block cache lets them go (`countOn` rules and caps are never cached), and requests waiting for
    // room (`wait`) ask again.
    // The units are settled whatever becomes of the news: a failed announcement is said, not thrown.
    await this.redis.news
      .announceLifted(
        settlements.flatMap(({ hit, refund }) => (refund && (!givenBack(hit) || hit.waitedOn) ? [hit.key] : [])),
      )
      .catch((error: unknown) => {
        const reason = describeError(error);
        this.problems.report(`announce:${reason}`, `Telling other instances of units given back failed (${reason})`);
      });
  }

  /** One call per slot: an instance holds few, each renewed a few times a lease. */
  override renewSlots(slots: readonly RateLimitRefund[], now?: number): Promise<(number | undefined)[]> {
    const at = now === undefined ? undefined : Math.floor(now);
    return Promise.all(
      slots.map((slot) => {
        const { keys, args } = encodeRenew(slot, at);
        return this.scripts.run(RENEW_SCRIPTS.for([slot.hit]), keys, args).then(decodeRenew);
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
}

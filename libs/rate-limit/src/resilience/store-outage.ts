import { describeError } from '../logging/describe-error.js';
import { LATE_ANSWER_GRACE_MS } from '../module/defaults.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  type RateLimitReceipt,
  type RateLimitStore,
  givenBack,
  holdsInFlight,
  unaskedDecision,
} from '../store/rate-limit-store.js';
import type { HitHandling, ResilientConsumption } from './deciding-store.js';
import type { LocalDecision, LocalFallback } from './local-fallback.js';
import type { PendingUnits } from './pending-units.js';
import type { RateLimitStoreErrorPolicy } from './store-error-policy.js';

/** Retry-After for requests refused because the store failed under the policy `'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

/**
 * What the resilient store does about the store failing: decides the requests it could not, by the
 * store-error policies (`decide`), learns from the late answers of a slow store, and once the store
 * answers again, records there what the fallback admitted meanwhile (`recordPending`) and holds
 * requests to the shares the fallback took of windows it decided (`refuseOverShare`).
 */
export class StoreOutage {
  /** Recording what the fallback admitted, once the store answers again (`recordPending`): one at a time. */
  private recording: Promise<void> | undefined;

  /** @param fallback the local fallback of a shared store; none for a store in this process */
  constructor(
    private readonly store: RateLimitStore,
    private readonly problems: StoreProblemLog,
    private readonly policy: RateLimitStoreErrorPolicy,
    private readonly fallback: LocalFallback | undefined,
  ) {}

  /**
   * Decides a request the store could not: `'deny'` if any rule denies; otherwise `'local'` rules
   * are decided together by this instance and `'allow'` rules admit.
   * @param unsent whether the request never reached the store (what the fallback admits is then
   *   recorded in it later)
   * @param sentAt when the failed call went out (undefined: not known)
   */
  async decide(
    hits: readonly RateLimitHit[],
    rules: readonly HitHandling[],
    error: unknown,
    given: number | undefined,
    unsent: boolean,
    sentAt: number | undefined,
  ): Promise<ResilientConsumption> {
    const now = given ?? Date.now();
    const policies = rules.map((rule) => rule.onStoreError ?? this.policy);
    const reason = describeError(error);
    this.problems.report(
      reason,
      `Rate-limit store failed (${reason}); requests decided by the store-error policy '${[...new Set(policies)].join('/')}'`,
    );
    const denied = policies.includes('deny');
    const localIndices = denied ? [] : policies.flatMap((policy, i) => (policy === 'local' ? [i] : []));
    const localHits = localIndices.map((i) => hits[i]);
    // The failure, not whether this request's call went out (one held behind a call on its keys
    // did not), tells whether Redis may be up: a call that may have run in it.
    const mayHaveRun = !this.store.neverReached(error);
    const local =
      localHits.length > 0 && this.fallback
        ? this.fallback.consume(localHits, now, unsent, mayHaveRun, sentAt)
        : undefined;
    if (this.fallback && !unsent) {
      const decided = local && { indices: localIndices, hits: localHits, decision: local };
      this.awaitLateAnswer(this.fallback, hits, error, given, decided);
    }
    const allowed = !denied && (local?.allowed ?? true);
    const decisions = hits.map((hit, i): RateLimitDecision => {
      const localAt = localIndices.indexOf(i);
      if (local && localAt >= 0) return local.decisions[localAt];
      const refused = policies[i] === 'deny' || (policies[i] === 'local' && !allowed);
      return refused
        ? { allowed: policies[i] !== 'deny' && allowed, limit: hit.limit, remaining: 0, resetMs: STORE_ERROR_RETRY_MS }
        : unaskedDecision(hit);
    });
    // A `settleCost` admission the fallback decided settles there: its receipts, where each hit is.
    const receipts =
      allowed && local?.receipts
        ? hits.map((_, i): RateLimitReceipt => local.receipts![localIndices.indexOf(i)])
        : undefined;
    return { allowed, decisions, receipts, storeError: policyOf(policies), failure: error };
  }

  /**
   * A slow Redis still runs a call past its deadline: its answer, late, tells the fallback the
   * counts, and settles what it decided meanwhile for this request (`BankedUnits.reconcile`), if
   * it recorded nothing of it. `localHits`: the hits at `localIndices`, which it decided.
   */
  private awaitLateAnswer(
    fallback: LocalFallback,
    hits: readonly RateLimitHit[],
    error: unknown,
    given: number | undefined,
    local: { indices: readonly number[]; hits: readonly RateLimitHit[]; decision: LocalDecision } | undefined,
  ): void {
    const late = this.store.lateAnswer(hits, error, given);
    const remember = (consumption: RateLimitConsumption) =>
      fallback.lastSeen.remember(hits, consumption, given ?? Date.now());
    if (!local || local.decision.recorded) {
      late?.then(remember).catch(() => undefined);
      return;
    }
    const { indices, decision } = local;
    const reconcile = (consumption: RateLimitConsumption | undefined) =>
      fallback.reconcile(
        local.hits,
        consumption && { ...consumption, decisions: indices.map((i) => consumption.decisions[i]) },
        decision.allowed,
        given ?? Date.now(),
      );
    // No answer will come (a reply lost with its connection): what was admitted here is recorded,
    // counted twice should Redis have run it, never not at all.
    if (!late) return reconcile(undefined);
    // Settled once: by the answer, or as lost when none came within LATE_ANSWER_GRACE_MS (Redis
    // seems down then, and most often never runs the call: a killed master, a partition).
    let settled = false;
    const settle = (consumption: RateLimitConsumption | undefined) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      reconcile(consumption);
    };
    const timer = setTimeout(() => settle(undefined), LATE_ANSWER_GRACE_MS).unref();
    late
      .then(
        (consumption) => {
          remember(consumption);
          settle(consumption);
        },
        () => settle(undefined),
      )
      .catch(() => undefined);
  }

  /**
   * A request Redis admitted past this instance's share of a window its fallback decided: refused.
   * What Redis counted of it stays counted, on the safe side: a refund would tell every instance the
   * key's count fell (`watchLiftedKeys`), and each would forget what it saw of the window, the shares
   * held and the figures the lost-write check compares, just when they matter. Only an admission
   * in flight is ended (it announces nothing), or it would stay so for a window: a `countOn` rule's
   * units and a cap's slot are refunded, a `settleCost` rule's claim ends with its reservation kept.
   *
   * Refused by the rules past their share, until that share stops holding (`refusals`), and by no
   * other: the rest keep Redis's admission. A refusal reads as what it is, for a `Retry-After` and
   * for the block cache, which keeps a refused key until the reset it reads: as the window's end,
   * every rule of the request read as refused for the rest of its window (a minute of 429s for a
   * client at 80% of the default, after a share of another rule ran out at a Redis restarted empty).
   */
  refuseOverShare(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    refusals: readonly (number | undefined)[],
    now: number,
  ): RateLimitConsumption {
    const inFlight = hits.flatMap((hit, i) =>
      holdsInFlight(hit) ? [{ hit, receipt: consumption.receipts![i], refund: givenBack(hit) }] : [],
    );
    if (inFlight.length > 0) void this.store.settle(inFlight).catch(() => undefined);
    return {
      allowed: false,
      decisions: consumption.decisions.map((decision, i) => {
        const until = refusals[i];
        if (until === undefined) return decision;
        return { ...decision, allowed: false, remaining: 0, resetMs: Math.max(0, Math.ceil(until - now)) };
      }),
      receipts: undefined,
    };
  }

  /**
   * The store answered for these hits while units the fallback admitted wait: records those of the
   * shards that answered, unless a recording is under way.
   */
  recordPending(hits: readonly RateLimitHit[], now: number | undefined): void {
    const { fallback } = this;
    if (!fallback || this.recording) return;
    const shards = new Set(hits.map((hit) => fallback.shardOf(hit.key)));
    if (fallback.pending.hasIn(shards)) {
      this.recording = this.recordFallbackUnits(fallback, now, shards).finally(() => (this.recording = undefined));
    }
  }

  /**
   * The store answers again on these shards: records there what the fallback admitted meanwhile
   * (for windows not over yet), so those requests count against the limit there too. Units of other
   * shards wait for theirs to answer: a call to a master still down would hold every request here
   * behind it, and might never be told apart from one that ran. Never throws.
   *
   * Every call goes out now, before any request's call made after this one: Redis runs a
   * connection's calls in order, so none decides without these units (a window's count would start
   * over, and admit the limit again), and none waits for their answers either (a stall meanwhile
   * would hold it past its deadline).
   */
  private async recordFallbackUnits(
    fallback: LocalFallback,
    now: number | undefined,
    shards: ReadonlySet<string>,
  ): Promise<void> {
    const units = fallback.pending.take(now ?? Date.now(), shards);
    const batches: PendingUnits[][] = [];
    for (let i = 0; i < units.length; i += 100) batches.push(units.slice(i, i + 100));
    const recorded = await Promise.allSettled(
      // Each into the window it was admitted in: one Redis started since holds none of its requests.
      batches.map((batch) =>
        this.store.record(
          batch.map((unit) => ({ ...unit.hit, windowEndsAt: unit.until })),
          now,
        ),
      ),
    );
    recorded.forEach((result, i) => {
      if (result.status === 'fulfilled') return;
      // Units whose call never went out wait for the next time Redis answers.
      if (this.store.neverReached(result.reason)) fallback.pending.putBack(batches[i]);
      const reason = describeError(result.reason);
      this.problems.report(`record:${reason}`, `Recording requests the fallback admitted failed (${reason})`);
    });
  }
}

/** The policy that decided a request the store could not: 'deny' if any rule denies. */
function policyOf(policies: readonly RateLimitStoreErrorPolicy[]): RateLimitStoreErrorPolicy {
  if (policies.includes('deny')) return 'deny';
  return policies.includes('local') ? 'local' : 'allow';
}

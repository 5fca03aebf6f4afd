import { LRUCache } from 'lru-cache';
import { ROUNDING_EPSILON } from '../../algorithms/algorithm.js';
import { LOCAL_FALLBACK_BOUND } from '../../module/defaults.js';
import type { StoreProblemLog } from '../../logging/store-problem-log.js';
import {
  givenBack,
  type RateLimitConsumption,
  type RateLimitHit,
  type RateLimitRefund,
  capacityOf,
  remainingAfter,
} from '../../store/rate-limit-store.js';
import type { LostWriteRaise } from '../scripts/raise.script.js';

/** One admission of this instance, as a sliding log's members name it. */
interface OwnAdmission {
  readonly at: number;
  readonly nonce: string;
  readonly cost: number;
}

/** What this instance last saw of a rule's state at one key. */
interface Seen {
  /** The rule then: another limit, window, burst or algorithm reports other figures, not a loss. */
  readonly rule: string;
  /** The time of the decision it was seen in, on Redis's clock (or the given `now`'s). */
  at: number;
  /** A fixed window's start on the same clock: names the window, however late the reply was read. */
  windowStart: number;
  /** Units used of the capacity after that decision. */
  used: number;
  /** A sliding log's: this instance's admissions still in the window, oldest first. */
  admissions?: OwnAdmission[];
}

/** What the check needs of the Redis store to set a state right. */
export interface LostWriteRepairs {
  /**
   * Takes back a refused request's units, telling no other instance: its count is what it was
   * before the request, which no block cache can have seen as full, and news of a lowered count
   * would make every instance forget what it saw of the key, just when that matters.
   */
  takeBack(refunds: readonly RateLimitRefund[]): Promise<void>;
  /** Raises a rule's state at a key to at least what was seen (`RAISE_SCRIPTS`). */
  raise(raise: LostWriteRaise): Promise<void>;
}

/** When each hit of a request was decided: Redis's time (or the given `now`), and a fixed window's start. */
export interface DecisionTimes {
  readonly at: readonly number[];
  readonly windowStarts: readonly number[];
}

/**
 * How fast a sliding window's estimate may fall: the previous window's count per window. That count
 * is at most the limit, or the local fallback's bound in an outage (1.05x) when the units it admitted
 * were recorded; a faster fall than this is a loss. (After a slow Redis, whose margin reaches 1.2x,
 * a count above 1.05x may read as a loss of up to 15% of it: the next window refuses a little early.
 * A looser bound missed the loss of a real failover: with 1.2, 6 units of 100.)
 */
const SLIDING_WINDOW_FALL_PER_LIMIT = LOCAL_FALLBACK_BOUND;

/** A sliding log's admissions remembered per key at most (the oldest go first: a weaker check, never a wrong one). */
const MAX_OWN_ADMISSIONS = 1_000;

/**
 * A failover defence: writes a promoted replica never received. Redis reports a state clearly below
 * the least it can hold by what this instance saw of it, and nothing errors. The check then decides
 * on the higher figure, raises the state in Redis to it (`RAISE_SCRIPTS`), and if the higher figure
 * refuses the request, takes back what Redis admitted.
 *
 * The least a state can hold, by algorithm, from the last decision seen (on Redis's clock, so a late
 * reply misleads nothing):
 * - fixed window: the count seen in the same window (a count never falls within its window);
 * - token bucket, GCRA: the units seen used, less what refills since (limit per window);
 * - sliding window: the estimate seen, less at most 1.05 limits per window since;
 * - sliding log: this instance's own admissions still in the window (its members expire one by
 *   one, so nothing less tells; each instance puts back its own).
 *
 * Differences within `max(2, 5% of the capacity)` are let be: other instances' refunds (Cluster slot
 * groups) lower a count by a few units, and figures are read whole. Rules with `countOn` and caps
 * are not checked, since their refunds lower counts by design (a cap's slots lost in a failover are
 * not put back: the requests holding them run uncounted until they end).
 */
export class LostWriteCheck {
  private readonly seen: LRUCache<string, Seen>;

  constructor(
    maxKeys: number,
    private readonly problems: StoreProblemLog,
  ) {
    this.seen = new LRUCache({ max: maxKeys });
  }

  /**
   * The request's consumption after the check.
   * @param recorded units admitted elsewhere (the local fallback's, recorded once Redis answers): a
   *   loss found then is raised back, and nothing is refused.
   */
  async check(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    times: DecisionTimes,
    repairs: LostWriteRepairs,
    recorded = false,
  ): Promise<RateLimitConsumption> {
    const raises: LostWriteRaise[] = [];
    let refused = false;
    const decisions = consumption.decisions.map((decision, i) => {
      const hit = hits[i];
      if (!checked(hit)) return decision;
      const at = times.at[i];
      const windowStart = times.windowStarts[i];
      const seen = this.seen.get(hit.key);
      if (!seen || seen.rule !== ruleOf(hit)) return decision;
      // A recorded unit's reply past the limit reads 0 left, counting the unit or not: nothing to tell.
      if (recorded && decision.remaining === 0) return decision;
      const least = leastHeld(seen, hit, at, windowStart);
      if (least === undefined) return decision;
      const figure = least + (consumption.allowed ? hit.cost : 0);
      const lost = figure - usedAfter(hit, consumption, i);
      if (lost < lossWorthRepairing(hit)) return decision;
      this.problems.report(
        `lost:${hit.key}`,
        `Redis lost writes of ${hit.key} (a failover?); counting on the higher figure`,
      );
      const allowed = decision.allowed && (recorded || figure <= capacityOf(hit));
      if (consumption.allowed && !allowed) refused = true;
      raises.push({
        hit,
        at,
        windowStart,
        figure,
        admissions: seen.admissions?.filter((a) => a.at > at - hit.windowMs),
      });
      return { ...decision, allowed, remaining: wholeRemaining(hit, figure) };
    });
    if (raises.length === 0) {
      this.remember(hits, consumption, times, raises);
      return consumption;
    }
    let checkedConsumption: RateLimitConsumption = { ...consumption, decisions };
    if (refused) {
      // This request is taken back: the figures to keep leave it out.
      for (const raise of raises) raise.figure -= raise.hit.cost;
      checkedConsumption = {
        allowed: false,
        decisions: decisions.map((decision, i) => {
          const raise = raises.find((r) => r.hit === hits[i]);
          return raise ? { ...decision, remaining: wholeRemaining(raise.hit, raise.figure) } : decision;
        }),
        receipts: undefined,
      };
    }
    try {
      if (refused) await repairs.takeBack(hits.map((hit, i) => ({ hit, receipt: consumption.receipts![i] })));
      for (const raise of raises) await repairs.raise(raise);
    } catch {
      // Best effort: the decision stands either way.
    }
    this.remember(hits, checkedConsumption, times, raises);
    return checkedConsumption;
  }

  /** A reset or refunded key holds less by design: what was seen of it is no loss to repair. */
  forget(keys: readonly string[]): void {
    for (const key of keys) this.seen.delete(key);
  }

  private remember(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    times: DecisionTimes,
    raises: readonly LostWriteRaise[],
  ): void {
    hits.forEach((hit, i) => {
      if (!checked(hit)) return;
      const at = times.at[i];
      const windowStart = times.windowStarts[i];
      const raised = raises.find((raise) => raise.hit === hit);
      const used = Math.max(usedAfter(hit, consumption, i), raised?.figure ?? 0);
      const rule = ruleOf(hit);
      let seen = this.seen.get(hit.key);
      if (seen && seen.rule !== rule) seen = undefined;
      if (hit.algorithm === 'sliding-log') {
        if (!consumption.allowed) return;
        const admission = { at, nonce: consumption.receipts![i].nonce, cost: hit.cost };
        if (!seen) {
          this.seen.set(hit.key, { rule, at, windowStart, used, admissions: [admission] });
          return;
        }
        const admissions = seen.admissions!.filter((a) => a.at > at - hit.windowMs);
        admissions.push(admission);
        if (admissions.length > MAX_OWN_ADMISSIONS) admissions.splice(0, admissions.length - MAX_OWN_ADMISSIONS);
        seen.admissions = admissions;
        return;
      }
      // A loss is at most the figure seen: one below what is worth repairing needs no memory, and
      // most keys' counts stay there (a key per client, far from its limit). Their entries would
      // only churn the cache, and evict the keys near their limit, which matter.
      if (used < lossWorthRepairing(hit) && !seen) return;
      if (hit.algorithm === 'fixed-window') {
        // A count never falls within its window: keep the highest figure seen in the same window.
        // (The local fallback keeps its own figures, by a window's end on this instance's clock: it
        // serves every algorithm and needs no exact window.)
        if (seen && seen.windowStart === windowStart) seen.used = Math.max(used, seen.used);
        else this.seen.set(hit.key, { rule, at, windowStart, used });
        return;
      }
      // A refusal's reply may read fuller than the state (a `blockFor` penalty reads as none left):
      // only admissions and repairs are figures to fall from.
      if (!consumption.allowed && !raised) return;
      // Replies of one ms, or read out of order, tell nothing of which came last: the later stands.
      if (seen && at <= seen.at) return;
      this.seen.set(hit.key, { rule, at, windowStart, used });
    });
  }
}

/**
 * The least units a state can hold at `at` (before the request decided then), by what was seen of
 * it; undefined when what was seen tells nothing (another window, a reply not later than it).
 */
function leastHeld(seen: Seen, hit: RateLimitHit, at: number, windowStart: number): number | undefined {
  const fall = (perWindow: number) => Math.max(0, seen.used - ((at - seen.at) * perWindow) / hit.windowMs);
  switch (hit.algorithm) {
    case 'fixed-window':
      return seen.windowStart === windowStart ? seen.used : undefined;
    case 'token-bucket':
    case 'gcra':
      return at > seen.at ? fall(hit.limit) : undefined;
    case 'sliding-window':
      return at > seen.at ? fall(hit.limit * SLIDING_WINDOW_FALL_PER_LIMIT) : undefined;
    case 'sliding-log': {
      let units = 0;
      // Strictly before `at`: an admission of the same ms may have been decided after this one.
      for (const admission of seen.admissions!)
        if (admission.at > at - hit.windowMs && admission.at < at) units += admission.cost;
      return units;
    }
  }
}

/** Units a hit's state holds after its request, of its capacity: nothing of a refused request. */
function usedAfter(hit: RateLimitHit, consumption: RateLimitConsumption, index: number): number {
  return capacityOf(hit) - remainingAfter(consumption.decisions[index], consumption.allowed, hit.cost);
}

/**
 * The least loss the check repairs: smaller differences are other instances' refunds (Cluster slot
 * groups lower a count by a few units) and figures read whole.
 */
function lossWorthRepairing(hit: RateLimitHit): number {
  return Math.max(2, Math.ceil(capacityOf(hit) * 0.05));
}

function ruleOf(hit: RateLimitHit): string {
  return `${hit.algorithm}|${hit.limit}|${hit.windowMs}|${hit.burst}`;
}

function checked(hit: RateLimitHit): boolean {
  return !givenBack(hit);
}

/** Units left of the capacity at a figure that may have fallen by a fraction: whole, as replies give them. */
function wholeRemaining(hit: RateLimitHit, figure: number): number {
  return Math.max(0, Math.floor(capacityOf(hit) - figure + ROUNDING_EPSILON));
}

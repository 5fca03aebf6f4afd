import { LRUCache } from 'lru-cache';
import type { StoreProblemLog } from '../../logging/store-problem-log.js';
import {
  type RateLimitConsumption,
  type RateLimitHit,
  type RateLimitRefund,
  committedUnits,
} from '../../store/rate-limit-store.js';

/** What this instance last saw of a fixed window. */
interface SeenWindow {
  /** The window's start on Redis's clock (or the given `now`'s): names it, however late the reply was read. */
  readonly start: number;
  /** The highest count seen in it (raised in place). */
  used: number;
  /** The rule's limit then: a changed limit changes the reported count, not a loss. */
  readonly limit: number;
}

/** What the check needs of the Redis store to set a count right. */
export interface LostWriteRepairs {
  refund(refunds: readonly RateLimitRefund[]): Promise<void>;
  /** Raises the window that started at `windowStart` to at least `figure`, if it is still the key's. */
  raiseFixedWindow(hit: RateLimitHit, windowStart: number, figure: number): Promise<void>;
}

/**
 * A failover defence: writes a promoted replica never received. Redis reports clearly less for a
 * fixed window than this instance saw in the same window, and nothing errors. The check then decides
 * on the higher figure, raises the counter in Redis to it, and if the higher figure refuses the
 * request, takes back what Redis admitted.
 *
 * Differences within `max(2, 5% of the limit)` are let be: other instances' refunds (Cluster slot
 * groups) lower a count by a few units. Rules with `countOn` are not checked, since their refunds
 * lower counts by design; nor are other algorithms, whose counts fall within a window by design.
 */
export class LostWriteCheck {
  private readonly seen: LRUCache<string, SeenWindow>;

  constructor(
    maxKeys: number,
    private readonly problems: StoreProblemLog,
  ) {
    this.seen = new LRUCache({ max: maxKeys });
  }

  /**
   * The request's consumption after the check.
   * @param windowStarts each hit's window start on Redis's clock (or the given `now`'s): it names
   *   the window, however late the reply was read.
   */
  async check(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    windowStarts: readonly number[],
    repairs: LostWriteRepairs,
  ): Promise<RateLimitConsumption> {
    const starts = hits.map((hit, i) => (checked(hit) ? windowStarts[i] : undefined));
    const raises: { hit: RateLimitHit; windowStart: number; figure: number }[] = [];
    let refused = false;
    const decisions = consumption.decisions.map((decision, i) => {
      const hit = hits[i];
      const start = starts[i];
      const seen = this.seen.get(hit.key);
      if (start === undefined || !seen || seen.start !== start || seen.limit !== hit.limit) return decision;
      const figure = seen.used + (consumption.allowed ? hit.cost : 0);
      const lost = figure - committedUnits(hit, consumption, i);
      if (lost < lossWorthRepairing(hit)) return decision;
      this.problems.report(
        `lost:${hit.key}`,
        `Redis lost writes of ${hit.key} (a failover?); counting on the higher figure`,
      );
      const allowed = decision.allowed && figure <= hit.limit;
      if (consumption.allowed && !allowed) refused = true;
      raises.push({ hit, windowStart: start, figure });
      return { ...decision, allowed, remaining: Math.max(0, hit.limit - figure) };
    });
    if (raises.length === 0) {
      this.remember(hits, consumption, starts);
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
          return raise ? { ...decision, remaining: Math.max(0, raise.hit.limit - raise.figure) } : decision;
        }),
        receipts: undefined,
      };
    }
    try {
      if (refused) await repairs.refund(hits.map((hit, i) => ({ hit, receipt: consumption.receipts![i] })));
      for (const { hit, windowStart, figure } of raises) await repairs.raiseFixedWindow(hit, windowStart, figure);
    } catch {
      // Best effort: the decision stands either way.
    }
    this.remember(hits, checkedConsumption, starts);
    return checkedConsumption;
  }

  /** A reset key starts afresh: what was seen of it is no loss to repair. */
  forget(keys: readonly string[]): void {
    for (const key of keys) this.seen.delete(key);
  }

  private remember(
    hits: readonly RateLimitHit[],
    consumption: RateLimitConsumption,
    starts: readonly (number | undefined)[],
  ): void {
    hits.forEach((hit, i) => {
      const start = starts[i];
      if (start === undefined) return;
      const used = committedUnits(hit, consumption, i);
      // A loss is at most the figure seen: one below what is worth repairing needs no memory, and
      // most keys' counts stay there (a key per client, far from its limit). Their entries would
      // only churn the cache, and evict the keys near their limit, which matter.
      if (used < lossWorthRepairing(hit)) return;
      const seen = this.seen.get(hit.key);
      // A fixed window's count never falls: keep the highest figure seen in the same window. (The
      // local fallback keeps its own figures, by a window's end on this instance's clock: it serves
      // every algorithm and needs no exact window.)
      if (seen && seen.start === start && seen.limit === hit.limit) seen.used = Math.max(used, seen.used);
      else this.seen.set(hit.key, { start, used, limit: hit.limit });
    });
  }
}

/**
 * The least loss the check repairs: smaller differences are other instances' refunds (Cluster slot
 * groups lower a count by a few units).
 */
function lossWorthRepairing(hit: RateLimitHit): number {
  return Math.max(2, Math.ceil(hit.limit * 0.05));
}

function checked(hit: RateLimitHit): boolean {
  return hit.algorithm === 'fixed-window' && !hit.conditional;
}

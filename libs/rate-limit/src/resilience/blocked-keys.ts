import { LRUCache } from 'lru-cache';
import {
  type RateLimitConsumption,
  type RateLimitDecision,
  type RateLimitHit,
  unaskedDecision,
} from '../store/rate-limit-store.js';

/** A key the store refused with nothing left, until the time it said a hit would be admitted. */
interface Block {
  /** On the clock of the calls (the module's `clock`, else `performance.now()`). */
  until: number;
  /** The rule's limit then: another limit is another question for the store. */
  limit: number;
  /** The cost refused: a cheaper hit may fit sooner, and is asked of the store. */
  cost: number;
}

/**
 * Keys a shared store refused, remembered until the reset it reported, so that an attack on one key
 * costs the store one call per key per window per instance instead of one per request.
 *
 * Only refusals that leave nothing (`remaining` 0) are kept, and a hit is refused here only when it
 * costs at least what was refused: a store's decision for a key improves only with time, or by a
 * refund, a reset or a higher limit, and each of those lifts the block (`forget`, told by the
 * store for every instance, or the limit compared on every hit). Blocks are kept only while that
 * news reaches this instance (`listening`), and never for `countOn` rules, which refund by design.
 * Times are taken from before the store's call was sent, so a block ends no later than the store's.
 */
export class BlockedKeys {
  private readonly blocks: LRUCache<string, Block>;
  /** Only while news of lifted keys reaches this instance (`listening`). */
  private enabled = false;
  /** Moves on every forgetting: a store's answer sent before one may predate a reset. */
  private generation = 0;

  constructor(maxKeys: number) {
    this.blocks = new LRUCache({ max: maxKeys });
  }

  /**
   * The store's decision again, for a request with a hit known to be refused at `now`; undefined
   * when it must ask. The other hits were not asked: they read as admitting with their full limit.
   */
  refusal(hits: readonly RateLimitHit[], now: number): RateLimitConsumption | undefined {
    if (!this.enabled || this.blocks.size === 0) return undefined;
    let refused: (RateLimitDecision | undefined)[] | undefined;
    hits.forEach((hit, i) => {
      const block = this.blocks.get(hit.key);
      if (!block || hit.conditional || hit.cost < block.cost || block.limit !== hit.limit || block.until <= now) return;
      refused ??= [];
      refused[i] = { allowed: false, limit: hit.limit, remaining: 0, resetMs: Math.ceil(block.until - now) };
    });
    if (!refused) return undefined;
    const decisions = hits.map((hit, i): RateLimitDecision => refused![i] ?? unaskedDecision(hit));
    return { allowed: false, decisions, receipts: undefined };
  }

  /** Where forgetting stands: pass it to `learn` for a call sent now. */
  get since(): number {
    return this.generation;
  }

  /**
   * Keeps the refusals of a store's answer to a call sent at `sentAt`, when `since` was `since`:
   * unless keys were forgotten meanwhile, since the answer may predate their reset.
   */
  learn(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, sentAt: number, since: number): void {
    if (!this.enabled || consumption.allowed || since !== this.generation) return;
    consumption.decisions.forEach((decision, i) => {
      const hit = hits[i];
      if (decision.allowed || decision.provisional || decision.remaining > 0 || hit.conditional || hit.cost === 0) {
        return;
      }
      this.blocks.set(hit.key, { until: sentAt + decision.resetMs, limit: hit.limit, cost: hit.cost });
    });
  }

  /** Keys reset or refunded: the store may admit them again. */
  forget(keys: readonly string[]): void {
    if (keys.length === 0) return;
    this.generation += 1;
    for (const key of keys) this.blocks.delete(key);
  }

  /**
   * Whether news of lifted keys reaches this instance. Either way every block goes: some may have
   * been lifted unseen. None is kept or served until it does.
   */
  listening(on: boolean): void {
    this.generation += 1;
    this.blocks.clear();
    this.enabled = on;
  }
}

import { LRUCache } from 'lru-cache';
import type { RateLimitHit } from '../store/rate-limit-store.js';

/**
 * Units admitted here while the store was out, to record in it once it is back; `until` their
 * window is over (recording them after would only punish later requests); `shard`: where their key
 * lives.
 */
export type PendingUnits = { hit: RateLimitHit; until: number; shard: string };

/**
 * What the local fallback admitted without reaching the store, by key: recorded there once the
 * shard of the key answers again (`ResilientStore`), so those requests count against the limit
 * there too.
 */
export class UnitsToRecord {
  private readonly byKey: LRUCache<string, PendingUnits>;
  /**
   * Keys with units pending, per shard: a shard that answers records its own, at once. Its size is
   * read on every answer of the store, so that nothing else is asked while none wait.
   */
  readonly perShard = new Map<string, number>();

  constructor(
    maxKeys: number,
    private readonly shardOf: (key: string) => string,
  ) {
    // A count of entries (`maxSize`, each of size 1), not `max`: `max` reserves room for all of
    // them at start, and units wait here only while the store is out.
    this.byKey = new LRUCache({
      maxSize: maxKeys,
      sizeCalculation: () => 1,
      dispose: ({ shard }) => {
        const left = (this.perShard.get(shard) ?? 1) - 1;
        if (left > 0) this.perShard.set(shard, left);
        else this.perShard.delete(shard);
      },
    });
  }

  get(key: string): PendingUnits | undefined {
    return this.byKey.get(key);
  }

  delete(key: string): void {
    this.byKey.delete(key);
  }

  /** Whether units wait to be recorded in any of these shards of the store. */
  hasIn(shards: ReadonlySet<string>): boolean {
    for (const shard of shards) if (this.perShard.has(shard)) return true;
    return false;
  }

  /** The units for keys of these shards whose window is not over, to record; forgets them. */
  take(now: number, shards?: ReadonlySet<string>): PendingUnits[] {
    const units: PendingUnits[] = [];
    // A copy: entries are deleted on the way.
    for (const [key, each] of Array.from(this.byKey.entries())) {
      if (shards && !shards.has(each.shard)) continue;
      this.byKey.delete(key);
      if (each.until > now) units.push(each);
    }
    return units;
  }

  /** Units taken to record that did not reach the store: recorded next time. */
  putBack(units: readonly PendingUnits[]): void {
    for (const each of units) this.add(each.hit, each.until, 0);
  }

  /** Units admitted without reaching the store, to record in the window they belong to (ending `until`). */
  add(hit: RateLimitHit, until: number, now: number): void {
    const units = this.byKey.get(hit.key);
    if (units && units.until > now) {
      units.hit = { ...units.hit, cost: units.hit.cost + hit.cost };
      units.until = Math.min(units.until, until);
      return;
    }
    const shard = this.shardOf(hit.key);
    // Replacing an entry disposes of it first, so the count stays one per key.
    this.byKey.set(hit.key, { hit, until, shard });
    this.perShard.set(shard, (this.perShard.get(shard) ?? 0) + 1);
  }
}

import { type RateLimitConsumption, type RateLimitHit, capacityOf } from '../store/rate-limit-store.js';

/** One key's calls that the store has not answered yet. */
interface KeyInFlight {
  /** Units of this key in those calls. */
  units: number;
  /** What the store last said was left of the key, while calls have been in flight; unknown before. */
  left: number | undefined;
  /** Calls held until one of this key's is answered: woken with the error when it failed. */
  waiting: ((error: unknown) => void)[];
}

/**
 * Keeps a burst on one key from asking the store once per request before any answer is back: one
 * GraphQL request with thousands of aliases of a limited field, or an attack's concurrent requests
 * for one identity, would otherwise all reach Redis before the first refusal could be kept by the
 * block cache. A call goes at once while none of its keys has units in flight, or while the units in
 * flight and its own fit in what the store last said was left (the limit, before it said anything);
 * otherwise it is held until a call of that key is answered, and then asks the block cache again.
 * So a burst costs the store about one call per unit the limit admits, plus one that learns the
 * refusal; the block cache answers the rest.
 *
 * It only orders calls, never decides one: what the store last said may be stale (another instance
 * consumed since, or a window ended), which only makes a call wait one answer longer. Only hits the
 * block cache can refuse are held (not `countOn` hits, not free ones), and no call waits on a key
 * with nothing in flight, so traffic spread over many keys, or on a key far from its limit, never
 * waits.
 */
export class KeysInFlight {
  private readonly keys = new Map<string, KeyInFlight>();

  /**
   * Enters a call of `hits` when it may go now (returns undefined; call `answered` after it), or
   * returns a promise that resolves once it should ask the block cache and `enter` again; with the
   * error of the call it waited for, if that failed: then it shares that failure instead of waiting
   * out another deadline.
   */
  enter(hits: readonly RateLimitHit[]): Promise<unknown> | undefined {
    for (const hit of hits) {
      if (!held(hit)) continue;
      const inFlight = this.keys.get(hit.key);
      if (inFlight && inFlight.units > 0 && inFlight.units + hit.cost > (inFlight.left ?? capacityOf(hit))) {
        return new Promise((resolve) => inFlight.waiting.push(resolve));
      }
    }
    for (const hit of hits) {
      if (!held(hit)) continue;
      const inFlight = this.keys.get(hit.key);
      if (inFlight) inFlight.units += hit.cost;
      else this.keys.set(hit.key, { units: hit.cost, left: undefined, waiting: [] });
    }
    return undefined;
  }

  /**
   * A call that `enter` let go has ended: with the store's answer, or with the error it failed with.
   * Wakes the calls held on its keys.
   */
  answered(hits: readonly RateLimitHit[], consumption: RateLimitConsumption | undefined, error?: unknown): void {
    hits.forEach((hit, i) => {
      if (!held(hit)) return;
      const inFlight = this.keys.get(hit.key);
      if (!inFlight) return;
      inFlight.units -= hit.cost;
      if (consumption) inFlight.left = consumption.decisions[i].remaining;
      const { waiting } = inFlight;
      if (waiting.length === 0) {
        if (inFlight.units === 0) this.keys.delete(hit.key);
        return;
      }
      // All of them ask again, in the order they came: the first ones go, the rest are held again
      // or refused by the block cache (`leave`). The entry stays for them: it holds what was left.
      inFlight.waiting = [];
      for (const wake of waiting) wake(error);
    });
  }

  /** A call that was held is decided without the store after all (the block cache refused it). */
  leave(hits: readonly RateLimitHit[]): void {
    for (const hit of hits) {
      const inFlight = this.keys.get(hit.key);
      if (inFlight && inFlight.units === 0 && inFlight.waiting.length === 0) this.keys.delete(hit.key);
    }
  }
}

/** Hits the block cache can refuse: others gain nothing from waiting for an answer. */
function held(hit: RateLimitHit): boolean {
  return !hit.conditional && hit.cost > 0;
}

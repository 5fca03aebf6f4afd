import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { PreparedRule } from '../prepare-hits.js';

/** Requests that wait per key for `countOn` units in flight; more are refused at once, without a penalty. */
const WAITERS_PER_KEY = 100;

/**
 * Requests that a `countOn` rule turned away only because of admissions still in flight wait here
 * for those to settle, instead of being refused for units that may yet be refunded, up to
 * `countOn.inFlightWaitMs`. A settle on this instance wakes the waiters of its keys at once; other
 * instances' admissions settle unseen, so a waiter also asks again after its own timeout, backing
 * off from 10 ms to 160 ms. At most 100 requests wait per key, so a flood of one identity can pile
 * up neither timers nor store calls. Only requests with a `countOn` rule come here.
 */
export class CountOnWaits {
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(private readonly maxWaitMs: number) {}

  /** Asks, and asks again while the only refusals are units in flight, until `maxWaitMs` or the client goes. */
  async decide(
    prepared: readonly PreparedRule[],
    ask: () => Promise<ResilientConsumption>,
    gone: () => boolean,
  ): Promise<ResilientConsumption> {
    const waitUntil = performance.now() + this.maxWaitMs;
    for (let attempt = 0; ; attempt += 1) {
      const consumption = await ask();
      const inFlight = consumption.storeError ? undefined : keysInFlight(prepared, consumption);
      const left = waitUntil - performance.now();
      if (
        inFlight &&
        left > 0 &&
        !gone() &&
        (await this.wait(inFlight, Math.min(left, 10 * 2 ** Math.min(attempt, 4))))
      ) {
        continue;
      }
      return consumption;
    }
  }

  /**
   * Resolves once an admission of one of `keys` settles here, or after `ms`: with true, or at once
   * with false when a key already has its most waiters.
   */
  private wait(keys: readonly string[], ms: number): Promise<boolean> {
    if (keys.some((key) => (this.waiters.get(key)?.size ?? 0) >= WAITERS_PER_KEY)) return Promise.resolve(false);
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        for (const key of keys) {
          const waiting = this.waiters.get(key);
          waiting?.delete(wake);
          if (waiting?.size === 0) this.waiters.delete(key);
        }
        resolve(true);
      };
      const timer = setTimeout(wake, ms);
      for (const key of keys) {
        let waiting = this.waiters.get(key);
        if (!waiting) this.waiters.set(key, (waiting = new Set()));
        waiting.add(wake);
      }
    });
  }

  /** Wakes every request waiting on one of `keys`. */
  settled(keys: readonly string[]): void {
    for (const key of keys) {
      const waiting = this.waiters.get(key);
      // Each wake removes only itself, which a Set allows during iteration.
      if (waiting) for (const wake of waiting) wake();
    }
  }
}

/**
 * The keys to wait on when every rule that rejected did so only because of `countOn` units still in
 * flight; undefined when the request is admitted or some rejection is final.
 */
function keysInFlight(prepared: readonly PreparedRule[], consumption: ResilientConsumption): string[] | undefined {
  if (consumption.allowed) return undefined;
  const keys: string[] = [];
  for (const [i, decision] of consumption.decisions.entries()) {
    // A shadowed rule's refusal refuses nothing: only the enforced rules' say whether to wait.
    if (decision.allowed || prepared[i].thresholds.mode === 'shadow') continue;
    if (!decision.provisional) return undefined;
    keys.push(prepared[i].hit.key);
  }
  return keys;
}

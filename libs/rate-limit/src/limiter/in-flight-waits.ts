/**
 * Requests that a `countOn` rule turned away only because of admissions still in flight wait here
 * for those to settle, instead of being refused for units that may yet be refunded. A settle on this
 * instance wakes the waiters of its keys at once; other instances' admissions settle unseen, so a
 * waiter also asks again after its own timeout. At most `maxPerKey` requests wait per key, so a flood
 * of one identity can pile up neither timers nor store calls.
 */
export class InFlightWaits {
  private readonly waiters = new Map<string, Set<() => void>>();

  constructor(private readonly maxPerKey: number) {}

  /**
   * Resolves once an admission of one of `keys` settles here, or after `ms`: with true, or at once
   * with false when a key already has `maxPerKey` waiters.
   */
  wait(keys: readonly string[], ms: number): Promise<boolean> {
    if (keys.some((key) => (this.waiters.get(key)?.size ?? 0) >= this.maxPerKey)) return Promise.resolve(false);
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

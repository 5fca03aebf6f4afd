/** Raised when Redis does not answer a call within `storeErrors.timeoutMs`. */
export class RedisTimeoutError extends Error {
  override readonly name = 'RedisTimeoutError';
}

interface Deadline {
  /** On `performance.now()`; Infinity while the call has not gone out (`sent`). */
  at: number;
  readonly what: string;
  settled: boolean;
  readonly fail: (error: unknown) => void;
}

/** Told how each call ended, in the same step that settles it (the circuit breaker). */
export interface CallOutcomes {
  succeeded(): void;
  /** A call failed (or missed its deadline): resolves to the promise the caller gets instead. */
  failed(error: unknown): Promise<never>;
}

/** Settled entries are dropped from the queue's front in batches of at least this many. */
const COMPACT_AFTER = 1_024;

/**
 * The deadlines of Redis calls that share one timeout, on one timer: a call costs a queue entry,
 * not a timer of its own (set and cleared on every call, those were a measurable share of a
 * decision). All calls have the same timeout, so deadlines fall due in the order calls were made.
 *
 * A call past its deadline rejects with `RedisTimeoutError` as Redis sees it, not as a stalled
 * event loop sees it. Timers run before I/O in each turn of the event loop, so after a long
 * synchronous stretch (a CPU-bound handler, a GC pause) the timer would fire before the reply that
 * arrived meanwhile is read, and a healthy Redis would look slow. So the verdict waits for
 * `setImmediate`, which runs after the loop's next I/O poll: a reply already in the socket by then
 * settles the call first. With an idle loop this adds nothing but one turn.
 */
export class CallDeadlines {
  private queue: Deadline[] = [];
  private head = 0;
  private timer: NodeJS.Timeout | undefined;
  /** Calls held with the rest of their turn's (`WriteBatches`), whose deadlines start when they go out. */
  private unsent: Deadline[] = [];

  constructor(private readonly timeoutMs: number) {}

  /**
   * `promise`, or a `RedisTimeoutError` naming `what` if it has not settled in time; `outcomes` is
   * told how it ended. One promise for all of it: every layer of promises is paid on every call.
   * @param held the call has not gone out yet: its deadline starts at `sent()`. A loop stalled
   *   before the call leaves must not count against Redis.
   */
  track<T>(promise: Promise<T>, what: string, outcomes?: CallOutcomes, held = false): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const fail = outcomes ? (error: unknown) => resolve(outcomes.failed(error)) : reject;
      const at = held ? Infinity : performance.now() + this.timeoutMs;
      const deadline: Deadline = { at, what, settled: false, fail };
      this.queue.push(deadline);
      if (held) this.unsent.push(deadline);
      else if (this.timer === undefined) this.arm(this.timeoutMs);
      promise.then(
        (value) => {
          if (deadline.settled) return;
          this.settle(deadline);
          outcomes?.succeeded();
          resolve(value);
        },
        (error: unknown) => {
          if (deadline.settled) return;
          this.settle(deadline);
          fail(error);
        },
      );
    });
  }

  /**
   * Marks a call settled and drops the settled calls at the queue's front. Replies come in the
   * order calls were made, so that is nearly always this one: the queue holds the calls in flight,
   * not every call of the last timeout. (Kept until the timer, thousands of settled entries each
   * survived the young generation's collections and were copied by every one: a scavenge took
   * twice as long and a request's p99 was several times the bare script's.)
   */
  private settle(deadline: Deadline): void {
    deadline.settled = true;
    const { queue } = this;
    if (queue[this.head] !== deadline) return;
    do this.head += 1;
    while (this.head < queue.length && queue[this.head].settled);
    if (this.head === queue.length) {
      queue.length = 0;
      this.head = 0;
    } else if (this.head >= COMPACT_AFTER) {
      this.queue = queue.slice(this.head);
      this.head = 0;
    }
  }

  /** The held calls have gone out: their deadlines run from now. */
  sent(): void {
    if (this.unsent.length === 0) return;
    const at = performance.now() + this.timeoutMs;
    for (const deadline of this.unsent) deadline.at = at;
    this.unsent = [];
    if (this.timer === undefined) this.arm(this.timeoutMs);
  }

  private arm(ms: number): void {
    // Unref: a call in flight keeps the process up through its socket, and an idle queue must not.
    this.timer = setTimeout(this.fire, Math.max(1, Math.ceil(ms))).unref();
  }

  private readonly fire = (): void => {
    this.timer = undefined;
    const now = performance.now();
    const { queue } = this;
    while (this.head < queue.length) {
      const deadline = queue[this.head];
      if (!deadline.settled && deadline.at > now) break;
      this.head += 1;
      if (!deadline.settled) {
        setImmediate(() => {
          if (deadline.settled) return;
          deadline.settled = true;
          deadline.fail(new RedisTimeoutError(`Redis did not answer ${deadline.what} within ${this.timeoutMs} ms`));
        });
      }
    }
    if (this.head >= COMPACT_AFTER || this.head === queue.length) {
      this.queue = queue.slice(this.head);
      this.head = 0;
    }
    // A call not sent yet has no deadline: `sent` arms the timer for it.
    if (this.head < this.queue.length && this.queue[this.head].at !== Infinity) {
      this.arm(this.queue[this.head].at - now);
    }
  };
}

/**
 * Rejects with `RedisTimeoutError` when `promise` has not settled `ms` after the call, as Redis sees
 * it, not as a stalled event loop sees it (the verdict waits for `setImmediate`, as `CallDeadlines`
 * explains). For the calls off the request path: connecting, operators' calls, WAIT, QUIT.
 */
export function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      setImmediate(() => {
        if (settled) return;
        settled = true;
        reject(new RedisTimeoutError(`Redis did not answer ${what} within ${ms} ms`));
      });
    }, ms);
    promise.then(
      (value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

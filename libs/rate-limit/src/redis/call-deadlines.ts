/** Raised when Redis does not answer a call within `storeErrors.timeoutMs`. */
export class RedisTimeoutError extends Error {
  override readonly name = 'RedisTimeoutError';
}

interface Deadline {
  /** On `performance.now()`. */
  readonly at: number;
  readonly what: string;
  settled: boolean;
  readonly reject: (error: Error) => void;
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

  constructor(private readonly timeoutMs: number) {}

  /** `promise`, or a `RedisTimeoutError` naming `what` if it has not settled in time. */
  track<T>(promise: Promise<T>, what: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const deadline: Deadline = { at: performance.now() + this.timeoutMs, what, settled: false, reject };
      this.queue.push(deadline);
      if (this.timer === undefined) this.arm(this.timeoutMs);
      promise.then(
        (value) => {
          if (deadline.settled) return;
          deadline.settled = true;
          resolve(value);
        },
        (error: unknown) => {
          if (deadline.settled) return;
          deadline.settled = true;
          reject(error as Error);
        },
      );
    });
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
          deadline.reject(new RedisTimeoutError(`Redis did not answer ${deadline.what} within ${this.timeoutMs} ms`));
        });
      }
    }
    if (this.head >= COMPACT_AFTER || this.head === queue.length) {
      this.queue = queue.slice(this.head);
      this.head = 0;
    }
    if (this.head < this.queue.length) this.arm(this.queue[this.head].at - now);
  };
}

import type { LoggerService } from '@nestjs/common';
import {
  CircuitBreakerPolicy,
  CircuitState,
  ConsecutiveBreaker,
  type IBreaker,
  SamplingBreaker,
  circuitBreaker,
  handleWhen,
} from 'cockatiel';
import { SampledLogger } from '../logging/sampled-logger.js';
import type { RateLimitCircuitBreakerOptions } from '../module/options.js';
import { RedisTimeoutError } from './redis-timeout.js';

export { RedisTimeoutError } from './redis-timeout.js';

/*
 * What keeps a request's call to Redis from hanging the request or piling onto a failing server: a
 * deadline per call, on one timer for all (`CallDeadlines`), and the circuit breaker that stops
 * calling while Redis fails (`RedisCircuitBreaker`); `ScriptRunner` puts every request's call
 * through both. (A call off the request path has a deadline of its own: `withDeadline`.)
 */

interface Deadline {
  /** On `performance.now()`; Infinity while the call has not gone out (`sent`). */
  at: number;
  readonly what: string;
  /** The call, for its late answer. */
  readonly call: Promise<unknown>;
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
 * The deadlines of Redis calls that share one timeout, on one timer: a call costs a queue entry, not
 * a timer of its own (a measurable share of a decision). Deadlines fall due in the calls' order.
 *
 * A call past its deadline rejects with `RedisTimeoutError` as Redis sees it, not as a stalled
 * event loop sees it. Timers run before I/O in each turn of the event loop, so after a long
 * synchronous stretch (a CPU-bound handler, a GC pause) the timer would fire before the reply that
 * arrived meanwhile is read, and a healthy Redis would look slow. So the verdict waits for
 * `setImmediate`, which runs after the loop's next I/O poll: a reply already in the socket by then
 * settles the call first. With an idle loop this adds nothing but one turn.
 */
export class CallDeadlines {
  /** Entries before `head` are let go (undefined): see `settle`. */
  private queue: (Deadline | undefined)[] = [];
  private head = 0;
  private timer: NodeJS.Timeout | undefined;
  /** Calls held with the rest of their turn's (`WriteBatches`), whose deadlines start when they go out. */
  private unsent: Deadline[] = [];

  constructor(private readonly timeoutMs: number) {}

  /** No call is in flight. */
  get idle(): boolean {
    return this.head === this.queue.length;
  }

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
      const deadline: Deadline = { at, what, call: promise, settled: false, fail };
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
   * Marks a call settled, and lets go of the settled calls at the queue's front (replies come in
   * order, so the queue holds the calls in flight): kept longer, entries held calls and answers
   * through young-generation collections, which copied them (p99 several times the floor's).
   */
  private settle(deadline: Deadline): void {
    deadline.settled = true;
    const { queue } = this;
    if (queue[this.head] !== deadline) return;
    while (this.head < queue.length && queue[this.head]!.settled) {
      queue[this.head] = undefined;
      this.head += 1;
    }
    this.compact();
  }

  private compact(): void {
    if (this.head === this.queue.length) {
      this.queue.length = 0;
      this.head = 0;
    } else if (this.head >= COMPACT_AFTER) {
      this.queue = this.queue.slice(this.head);
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
      const deadline = queue[this.head]!;
      if (!deadline.settled && deadline.at > now) break;
      queue[this.head] = undefined;
      this.head += 1;
      if (!deadline.settled) {
        setImmediate(() => {
          if (deadline.settled) return;
          deadline.settled = true;
          const message = `Redis did not answer ${deadline.what} within ${this.timeoutMs} ms`;
          deadline.fail(new RedisTimeoutError(message, deadline.call));
        });
      }
    }
    this.compact();
    // A call not sent yet has no deadline: `sent` arms the timer for it.
    const first = this.queue[this.head];
    if (first && first.at !== Infinity) this.arm(first.at - now);
  };
}

export type CircuitBreakerState = 'closed' | 'open' | 'half-open';

const STATE_NAMES: Record<CircuitState, CircuitBreakerState> = {
  [CircuitState.Closed]: 'closed',
  [CircuitState.Open]: 'open',
  [CircuitState.HalfOpen]: 'half-open',
  [CircuitState.Isolated]: 'open',
};

/** Opens when either breaker says so: a share of recent calls failed, or several in a row did. */
class EitherBreaker implements IBreaker {
  constructor(private readonly breakers: readonly IBreaker[]) {}

  get state(): unknown {
    return this.breakers.map((breaker) => breaker.state);
  }

  set state(value: unknown) {
    (value as unknown[]).forEach((state, i) => (this.breakers[i].state = state));
  }

  success(state: CircuitState): void {
    for (const breaker of this.breakers) breaker.success(state);
  }

  failure(state: CircuitState): boolean {
    // Every breaker must see every failure, so no short-circuiting.
    return this.breakers.map((breaker) => breaker.failure(state)).includes(true);
  }
}

/**
 * Whether a failed call says Redis is failing, rather than one key is bad. A key of another type
 * (WRONGTYPE) is an answer from a healthy Redis about that key alone: the scripts mend such keys,
 * and if one still fails, that request is decided by its rule's `onStoreError`, and nobody else's.
 */
export function isRedisFailure(error: Error): boolean {
  // Redis 7 replies `WRONGTYPE …`; Redis 6 wraps it in `ERR Error running script … WRONGTYPE …`.
  return !/\bWRONGTYPE\b/.test(String(error?.message));
}

/**
 * Stops sending to Redis while it is failing: once open, calls fail at once (and the fallback
 * policy decides), until a probe call succeeds. `state` tells where it is. Transitions are logged
 * by sampling: the first of each kind at once, then at most one line per kind per interval counting
 * those since, so an outage that flaps open and half-open every 250 ms writes a few lines, not 8 a
 * second.
 */
export class RedisCircuitBreaker implements CallOutcomes {
  private readonly policy: CircuitBreakerPolicy;
  private readonly breaker: EitherBreaker;
  private readonly transitions: SampledLogger;
  constructor(options: Required<RateLimitCircuitBreakerOptions>, logger: LoggerService, logIntervalMs: number) {
    this.transitions = new SampledLogger(logger, {
      intervalMs: logIntervalMs,
      maxLinesPerSecond: 3,
      maxKeys: 4,
      level: 'warn',
      summary: 'Redis circuit transitions',
    });
    this.breaker = new EitherBreaker([
      new SamplingBreaker({
        threshold: options.failureRatio,
        duration: options.windowMs,
        minimumRps: options.minimumCalls / (options.windowMs / 1000),
      }),
      new ConsecutiveBreaker(options.consecutiveFailures),
    ]);
    this.policy = circuitBreaker(handleWhen(isRedisFailure), {
      halfOpenAfter: options.halfOpenAfterMs,
      breaker: this.breaker,
    });
    const messages: Record<CircuitState, string> = {
      [CircuitState.Open]: `Redis circuit open: no calls to Redis for ${options.halfOpenAfterMs} ms; requests follow the store-error policies`,
      [CircuitState.HalfOpen]: 'Redis circuit half-open: probing Redis with one call',
      [CircuitState.Closed]: 'Redis circuit closed: Redis decides again',
      [CircuitState.Isolated]: 'Redis circuit isolated',
    };
    this.policy.onStateChange((state) => {
      // Counts of earlier transitions first, so a closing line is never followed by stale ones.
      if (state === CircuitState.Closed) this.transitions.flush(true);
      this.transitions.record(STATE_NAMES[state], messages[state]);
    });
  }

  /** Writes the transitions not reported yet: call on shutdown. */
  close(): void {
    this.transitions.close();
  }

  get state(): CircuitBreakerState {
    return STATE_NAMES[this.policy.state];
  }

  /**
   * Whether calls go to Redis unguarded now: then the caller runs them itself and reports how each
   * ended (`succeeded`, `failed`), as cockatiel's `execute` would, without its layers of promises
   * on every call. Otherwise `execute` decides.
   */
  get closed(): boolean {
    return this.policy.state === CircuitState.Closed;
  }

  /** A call made while closed succeeded. */
  succeeded(): void {
    this.breaker.success(CircuitState.Closed);
  }

  /**
   * A call made while closed failed: counted through `execute` (which opens the circuit when it
   * must); rejects with the call's own error either way. (Calls past their deadline come through
   * `LateAnswers`, which counts them once judged.)
   */
  failed(error: unknown): Promise<never> {
    if (this.policy.state !== CircuitState.Closed) return Promise.reject(error);
    const rejected = () => Promise.reject(error);
    return this.policy.execute(rejected).then(rejected, rejected);
  }

  /** Counts a failed call made while closed, which may open the circuit. */
  countFailure(error: unknown): void {
    if (this.policy.state === CircuitState.Closed)
      this.policy.execute(() => Promise.reject(error)).catch(() => undefined);
  }

  execute<T>(call: () => Promise<T>): Promise<T> {
    if (this.policy.state !== CircuitState.Closed) return this.policy.execute(call);
    return call().then(
      (value) => {
        this.succeeded();
        return value;
      },
      (error: unknown) => this.failed(error),
    );
  }
}

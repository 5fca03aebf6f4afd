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

export interface RateLimitCircuitBreakerOptions {
  /** Open when at least this share of calls in the window failed or timed out. Default 0.3. */
  failureRatio?: number;
  /** ...counting only windows with at least this many calls. Default 20. */
  minimumCalls?: number;
  /** The window the share is taken over. Default 10 s. */
  windowMs?: number;
  /** Open after this many failures in a row, whatever the share. Default 5. */
  consecutiveFailures?: number;
  /** Let one probe call through this long after opening; its success closes the circuit. Default 250 ms. */
  halfOpenAfterMs?: number;
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
export class RedisCircuitBreaker {
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
   * must); rejects with the call's own error either way.
   */
  failed(error: unknown): Promise<never> {
    if (this.policy.state !== CircuitState.Closed) return Promise.reject(error);
    return this.policy
      .execute(() => Promise.reject(error))
      .then(
        () => Promise.reject(error),
        () => Promise.reject(error),
      );
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

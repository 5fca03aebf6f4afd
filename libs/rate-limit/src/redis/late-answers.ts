import { LATE_ANSWER_GRACE_MS, SLOW_REDIS_MEMORY_MS } from '../module/defaults.js';
import type { RedisCircuitBreaker } from './call-safety.js';
import { RedisTimeoutError } from './redis-timeout.js';

/**
 * What becomes of a request's call past its deadline. The request is decided at the deadline, by
 * the store-error policy: the deadline is the promise, and a Redis stalled by a fork or a slow
 * command must not hold requests past it. Redis may be slow, not down: it still runs the call and
 * answers late, and that answer tells the local fallback the true counts (`lateAnswer`, and
 * `LocalFallback.reconcile`).
 *
 * Each late call is judged once: answered within LATE_ANSWER_GRACE_MS is a success for the circuit
 * breaker (a slow Redis is not a failing one, and opening the circuit on it would leave calls
 * unsent while other instances' on-time calls decide without them), unanswered a failure. Redis
 * seems down, rather than slow, once a call went unanswered that long in the last
 * SLOW_REDIS_MEMORY_MS, and none was answered since: the fallback then shares all of what Redis
 * last reported left, not only the margin a slow Redis leaves.
 */
export class LateAnswers {
  /** Calls past their deadline, as judged: answered late, or not within LATE_ANSWER_GRACE_MS. */
  readonly counts = { answered: 0, unanswered: 0 };
  /** When (`performance.now()`) a call past its deadline was last left unanswered. */
  private lastUnansweredAt = -Infinity;
  /**
   * A call went unanswered, and none has been answered since (on time or late). Read by the runner
   * on every call answered on time, which says Redis is up (`answeredOnTime`).
   */
  down = false;

  /** @param breaker told how each late call ended, once judged */
  constructor(private readonly breaker: RedisCircuitBreaker | undefined) {}

  /** Whether Redis seems down rather than slow: a call went unanswered lately, and none was answered since. */
  get redisSeemsDown(): boolean {
    return this.down && performance.now() - this.lastUnansweredAt < SLOW_REDIS_MEMORY_MS;
  }

  /** A call was answered on time while Redis seemed down: it is back. */
  answeredOnTime(): void {
    this.down = false;
  }

  /** A call failed: one past its deadline rejects now, and is judged when its answer comes, or does not. */
  failed(error: unknown): Promise<never> {
    if (!(error instanceof RedisTimeoutError && error.answer)) {
      return this.breaker ? this.breaker.failed(error) : Promise.reject(error);
    }
    this.judge(error.answer, error);
    return Promise.reject(error);
  }

  /**
   * Answered if the call's answer comes within LATE_ANSWER_GRACE_MS, unanswered otherwise. An error
   * reply (a script error, `OOM`) is an answer: Redis is up, though the call failed.
   */
  private judge(answer: Promise<unknown>, error: RedisTimeoutError): void {
    let judged = false;
    const timer = setTimeout(() => end('unanswered', error), LATE_ANSWER_GRACE_MS).unref();
    const end = (verdict: 'answered' | 'unanswered' | 'lost', failure: unknown) => {
      if (judged) return;
      judged = true;
      clearTimeout(timer);
      if (verdict === 'answered') {
        this.counts.answered += 1;
        this.down = false;
      } else {
        this.counts.unanswered += 1;
        // Only silence for the whole grace says Redis is down; a call lost with its connection
        // (a dropped link, a restart) says nothing of whether Redis ran it, or runs others.
        if (verdict === 'unanswered') {
          this.lastUnansweredAt = performance.now();
          this.down = true;
        }
      }
      if (failure === undefined) this.breaker?.succeeded();
      else this.breaker?.countFailure(failure);
    };
    answer.then(
      () => end('answered', undefined),
      (failure: unknown) => end(isReplyError(failure) ? 'answered' : 'lost', failure ?? error),
    );
  }
}

/** Whether a failed call was answered by Redis (an error reply), rather than lost with its connection. */
function isReplyError(failure: unknown): boolean {
  return failure instanceof Error && failure.name === 'ReplyError';
}

import { LATE_ANSWER_GRACE_MS, SLOW_REDIS_MEMORY_MS } from '../module/defaults.js';
import { type CallOutcomes, type RedisCircuitBreaker, RedisTimeoutError } from './call-safety.js';

/**
 * What becomes of a request's call past its deadline. Redis may be slow (stalled by a fork, a slow
 * command, a noisy neighbour), not down: it still runs the call and answers late, and its answer is
 * the truth. Deciding without it is what lets a slow Redis admit more than the limit: between
 * stalls, Redis admits the limit on time to other instances this one has not heard of.
 *
 * So a call past its deadline waits up to LATE_ANSWER_GRACE_MS more for its answer, which then
 * settles the call (`storeErrors.waitForLateAnswers`), unless Redis seems down: it left a call
 * unanswered that long in the last SLOW_REDIS_MEMORY_MS, and answered none late since. A Redis that
 * does not answer (paused, unreachable) thus holds the calls of its first second; after that, calls
 * are decided at their deadline, and the circuit breaker opens soon.
 *
 * Each late call is judged once, whether waited for or not: answered is a success for the circuit
 * breaker (a slow Redis is not a failing one, and opening the circuit on it would leave calls
 * unsent while other instances' on-time calls decide without them), unanswered a failure.
 */
export class LateAnswers implements CallOutcomes {
  /** Calls past their deadline, as judged: answered late, or not within LATE_ANSWER_GRACE_MS. */
  readonly counts = { answered: 0, unanswered: 0 };
  /** When (`performance.now()`) a call past its deadline was last left unanswered. */
  private lastUnansweredAt = -Infinity;
  /** A call went unanswered, and none has been answered since (on time or late). */
  private down = false;

  /**
   * @param wait `storeErrors.waitForLateAnswers`
   * @param breaker told how each call ended, late ones once judged
   */
  constructor(
    private readonly wait: boolean,
    private readonly breaker: RedisCircuitBreaker | undefined,
  ) {}

  /** Whether Redis seems down rather than slow: a call went unanswered lately, and none was answered since. */
  get redisSeemsDown(): boolean {
    return this.down && performance.now() - this.lastUnansweredAt < SLOW_REDIS_MEMORY_MS;
  }

  succeeded(): void {
    // An answer on time says Redis is back (a boolean: this runs on every call).
    if (this.down) this.down = false;
    this.breaker?.succeeded();
  }

  /** A call failed: a call past its deadline is judged, and may settle with its late answer. */
  failed(error: unknown): Promise<never> {
    if (!(error instanceof RedisTimeoutError && error.answer)) {
      return this.breaker ? this.breaker.failed(error) : Promise.reject(error);
    }
    const waits = this.wait && !this.redisSeemsDown;
    const verdict = this.judge(error.answer, error);
    if (waits) return verdict as Promise<never>;
    verdict.catch(() => undefined);
    return Promise.reject(error);
  }

  /**
   * Resolves with the call's answer, if it comes within LATE_ANSWER_GRACE_MS; rejects otherwise. An
   * error reply (a script error, `OOM`) is an answer: Redis is up, though the call failed.
   */
  private judge(answer: Promise<unknown>, error: RedisTimeoutError): Promise<unknown> {
    return new Promise((resolve, reject) => {
      let judged = false;
      const timer = setTimeout(() => end('unanswered', error), LATE_ANSWER_GRACE_MS).unref();
      const end = (verdict: 'answered' | 'unanswered' | 'lost', failure: unknown, value?: unknown) => {
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
        if (failure === undefined) {
          this.breaker?.succeeded();
          resolve(value);
        } else {
          this.breaker?.countFailure(failure);
          reject(failure);
        }
      };
      answer.then(
        (value) => end('answered', undefined, value),
        (failure: unknown) => end(isReplyError(failure) ? 'answered' : 'lost', failure ?? error),
      );
    });
  }
}

/** Whether a failed call was answered by Redis (an error reply), rather than lost with its connection. */
function isReplyError(failure: unknown): boolean {
  return failure instanceof Error && failure.name === 'ReplyError';
}

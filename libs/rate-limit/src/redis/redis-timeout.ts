/*
 * A call Redis did not answer in time: the error every deadline rejects with, and the deadline of a
 * single call off the request path (connecting, an operator's call, WAIT, QUIT). The requests'
 * calls share one timer instead (`CallDeadlines`, in `call-safety.ts`).
 */

/** Raised when Redis does not answer a call within `storeErrors.timeoutMs`. */
export class RedisTimeoutError extends Error {
  override readonly name = 'RedisTimeoutError';

  /**
   * @param answer the call itself, when it went out: a Redis that is slow, not down, still runs it
   *   and answers late, and the answer tells the truth about the counters (`lateAnswer`).
   */
  constructor(
    message: string,
    readonly answer?: Promise<unknown>,
  ) {
    super(message);
  }
}

/**
 * Rejects with `RedisTimeoutError` when `promise` has not settled `ms` after the call, as Redis sees
 * it, not as a stalled event loop sees it (the verdict waits for `setImmediate`, as `CallDeadlines`
 * explains).
 */
export function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const settle = (end: () => void) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      end();
    };
    const timeout = () => reject(new RedisTimeoutError(`Redis did not answer ${what} within ${ms} ms`));
    const timer = setTimeout(() => setImmediate(() => settle(timeout)), ms);
    promise.then(
      (value) => settle(() => resolve(value)),
      (error: unknown) => settle(() => reject(error)),
    );
  });
}

import type { RateLimitOutcome } from '../limiter/rate-limit-outcome.js';

const OUTCOME = Symbol('rate-limit:outcome');

type WithOutcome = { [OUTCOME]?: RateLimitOutcome };

/** The guard's decision for a request, for the interceptor and for a guard registered twice. */
export function outcomeOf(request: object): RateLimitOutcome | undefined {
  return (request as WithOutcome)[OUTCOME];
}

export function attachOutcome(request: object, outcome: RateLimitOutcome): void {
  (request as WithOutcome)[OUTCOME] = outcome;
}

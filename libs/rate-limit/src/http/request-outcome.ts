import type { RateLimitOutcome } from '../limiter/rate-limit-outcome.js';

/**
 * The guard's decision per request, so a guard registered twice (globally and with `@UseGuards`)
 * decides once. Beside the request rather than on it: a property added to Express's request
 * object cost about 1 µs a request (its shape changes on every one).
 */
const OUTCOMES = new WeakMap<object, RateLimitOutcome>();

export function outcomeOf(request: object): RateLimitOutcome | undefined {
  return OUTCOMES.get(request);
}

export function attachOutcome(request: object, outcome: RateLimitOutcome): void {
  OUTCOMES.set(request, outcome);
}

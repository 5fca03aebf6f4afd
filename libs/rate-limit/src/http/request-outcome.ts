import type { ExecutionContext } from '@nestjs/common';
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

/** What decides a request's rules once the app's guards have run: the guard that passed it on. */
export interface AfterGuardsDecider {
  /** Resolves when admitted (or nothing to decide); throws the rejection otherwise. */
  decideAfterGuards(context: ExecutionContext): Promise<boolean>;
}

/** Per request, the guard that left its rules to `RateLimitInterceptor`. */
const DEFERRED = new WeakMap<object, AfterGuardsDecider>();

export function deferToInterceptor(request: object, guard: AfterGuardsDecider): void {
  DEFERRED.set(request, guard);
}

export function guardDeferredTo(request: object): AfterGuardsDecider | undefined {
  return DEFERRED.get(request);
}

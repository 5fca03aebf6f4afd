import type { DecisionObserver } from '../limiter/decision-observer.js';
import type { LimiterStep } from '../limiter/limiter-step.js';
import type { ConditionalUnits, RateLimitOutcome } from '../limiter/rate-limit-outcome.js';

/** `rateLimitMetrics()`'s step: every decision counted, after every other step has had its say (`nearLimit`). */
export class MetricsStep implements LimiterStep {
  constructor(private readonly observer: DecisionObserver) {}

  decided(outcome: RateLimitOutcome): void {
    this.observer.decided(outcome);
  }

  released(_keys: readonly string[], _how: 'reset' | 'settled', units?: readonly ConditionalUnits[]): void {
    if (units) this.observer.settled(units);
  }
}

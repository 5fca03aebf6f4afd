import type { ResilientConsumption } from '../resilience/deciding-store.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { LimitedRequest } from './limited-request.js';
import type { PreparedRule } from './prepare-hits.js';
import type { RateLimitOutcome } from './rate-limit-outcome.js';

/** The store call of one decision: every given rule admits, or none counts. */
export type Consume = (prepared: readonly PreparedRule[]) => Promise<ResilientConsumption>;

/**
 * How the module composes a step: made the first time a rule that `uses` it is decided (never, if
 * no rule does); without `uses`, made at once and run for every request (an option's step).
 */
export interface StepEntry {
  uses?(rule: RateLimitRule): boolean;
  make(): LimiterStep;
}

/**
 * A rule feature, composed into the limiter by the module only where a rule or an option uses it
 * (`LimiterSteps`). The limiter runs the hooks of a request's steps and names no feature itself:
 * a new capability is a new step, not a branch in the limiter. Every hook is optional.
 */
export interface LimiterStep {
  /**
   * Around the store call: may call `next` again (with fewer rules, after a wait) or another
   * store's in its stead. Steps wrap in their order: the first is outermost.
   * @param request none outside HTTP (`consume`)
   */
  consume?(
    prepared: readonly PreparedRule[],
    next: Consume,
    request: LimitedRequest | undefined,
  ): Promise<ResilientConsumption>;
  /**
   * Sees the outcome once it is made, in the steps' order, and may add to it (its decisions' flags,
   * the units left to settle). A request refused without a store call (a ban) has no `consumption`.
   */
  decided?(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void;
  /**
   * Sees an outcome with a refusal (a shadow rule's beside an admission too); `decided` sees it
   * first. A step that acts on refusals only keeps off the path of admitted requests.
   */
  refused?(
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): void;
  /** Keys whose units were released: reset (`RateLimiterService.reset`) or settled (`settle`). */
  released?(keys: readonly string[], how: 'reset' | 'settled'): void;
  /** At the app's shutdown. */
  close?(): void;
}

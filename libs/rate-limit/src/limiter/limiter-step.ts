import type { ResilientConsumption } from '../resilience/deciding-store.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { LimitedRequest } from './limited-request.js';
import type { PreparedRule } from './prepare-hits.js';
import type { ConditionalUnits, RateLimitOutcome } from './rate-limit-outcome.js';
import type { RateLimitOverride } from './limit-values.js';
import type { Thresholds } from './rule-thresholds.js';

type MaybePromise<T> = T | Promise<T>;

/** A rule made concrete for one request under the given thresholds; null: the rule does not count it. */
export type Prepare = (rule: RateLimitRule, thresholds: Thresholds) => MaybePromise<PreparedRule | null>;

/** What a screen answers: no rule counts the request (an exemption). */
export const NOT_COUNTED = 'not counted';

/** One request (or unit of work outside HTTP) as the screens see it, before its rules are prepared. */
export interface Screening {
  /** Its rules in force (none `'off'`). */
  readonly rules: readonly RateLimitRule[];
  /** The transport's; none outside HTTP. */
  readonly request: LimitedRequest | undefined;
  /**
   * A rule prepared as its `by` and `cost` say, before any step's: once per request, so the decision
   * takes what a screen prepared. Rejects as a resolver that throws.
   */
  prepared(rule: RateLimitRule): MaybePromise<PreparedRule>;
}

/** What the limiter lends the steps it makes: how it reads thresholds, counts addresses and tells time. */
export interface StepKit {
  /** The thresholds in force for a rule now: the decorator's, or its config key's. */
  thresholdsOf(rule: RateLimitRule): Thresholds;
  /** The thresholds of an identity with values of its own, over its rule's config key's. */
  thresholdsWith(rule: RateLimitRule, values: RateLimitOverride): Thresholds;
  /** A prepared rule counted under other thresholds (under its algorithm's key). */
  withThresholds(prepared: PreparedRule, thresholds: Thresholds): PreparedRule;
  /** A client's address as a `by: 'ip'` rule counts it (IPv6 per prefix). */
  clientIdentity(address: string): string;
  /** The module's clock, in ms. */
  now(): number;
}

/** The store call of one decision: every given rule admits, or none counts. */
export type Consume = (prepared: readonly PreparedRule[]) => Promise<ResilientConsumption>;

/**
 * How the module composes a step: made the first time a rule that `uses` it is decided (never, if
 * no rule does); without `uses`, made at once and run for every request (an option's step).
 */
export interface StepEntry {
  uses?(rule: RateLimitRule): boolean;
  make(kit: StepKit): LimiterStep;
}

/**
 * A rule feature, composed into the limiter by the module only where a rule or an option uses it
 * (`LimiterSteps`). The limiter runs the hooks of a request's steps and names no feature itself:
 * a new capability is a new step, not a branch in the limiter. Every hook is optional.
 */
export interface LimiterStep {
  /**
   * Before any rule is prepared, for a step of the module's (an option's or the config centre's):
   * refuses the request with an outcome of its own (a ban), lets no rule count it (`NOT_COUNTED`),
   * or leaves it to the rules (undefined). Screens run in the steps' order; the first answer stands.
   */
  screen?(screening: Screening): MaybePromise<RateLimitOutcome | typeof NOT_COUNTED | undefined>;
  /**
   * Makes a rule concrete for one request around `next` (the rules' own `by` and `cost` innermost):
   * may skip it (null), count it under other thresholds or another rule (a tier), or under an
   * identity's own values. Steps wrap in their order: the first is outermost.
   * @param request none outside HTTP (`consume`)
   */
  prepare?(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
    request: LimitedRequest | undefined,
  ): MaybePromise<PreparedRule | null>;
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
  /**
   * Keys whose units were released: reset (`RateLimiterService.reset`) or settled (`settle`, with
   * the units the request held, as the outcome listed them).
   */
  released?(keys: readonly string[], how: 'reset' | 'settled', units?: readonly ConditionalUnits[]): void;
  /** At the app's shutdown. */
  close?(): void;
}

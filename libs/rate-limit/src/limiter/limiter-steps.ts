import type { ResilientConsumption } from '../resilience/deciding-store.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import type { LimitedRequest } from './limited-request.js';
import type { Consume, LimiterStep, NOT_COUNTED, Prepare, Screening, StepEntry, StepKit } from './limiter-step.js';
import type { PreparedRule } from './prepare-hits.js';
import type { ConditionalUnits, RateLimitOutcome } from './rate-limit-outcome.js';
import type { Thresholds } from './rule-thresholds.js';

/** The steps of a request none of whose rules uses one: one shared list. */
const NONE: readonly LimiterStep[] = Object.freeze([]);

/**
 * The limiter's steps, as the module composed them from its options and the features rules use,
 * in the order they run; and which of them each rule's requests run, found once per rule. A rule's
 * step is made when the first rule that uses it is decided: a feature no rule uses costs nothing,
 * and a request whose rules use none runs none, paying one lookup per rule for the seam.
 */
export class LimiterSteps {
  private readonly ofRule = new WeakMap<RateLimitRule, readonly LimiterStep[]>();
  private readonly preparingRule = new WeakMap<RateLimitRule, readonly LimiterStep[]>();
  private readonly made = new Map<StepEntry, LimiterStep>();
  /** The steps of the module's options, which every request runs. */
  private everyRequest: readonly LimiterStep[] = NONE;
  /** Those of them that screen requests before their rules are prepared. */
  private screens: readonly LimiterStep[] = NONE;
  private kit: StepKit | undefined;

  constructor(private readonly entries: readonly StepEntry[]) {}

  /** Whether any step screens requests: without one, rules are prepared at once. */
  screening = false;
  /**
   * Rules none of whose steps prepares them, wraps the store call or sees an admission (nearly
   * every rule): an admitted request of them runs no step, nor this file. Known once a rule's steps are.
   */
  readonly plain = new WeakSet<RateLimitRule>();

  /** Makes the options' steps, with what the limiter lends them; before its first request. */
  start(kit: StepKit): void {
    this.kit = kit;
    for (const entry of this.entries) if (!entry.uses) this.made.set(entry, entry.make(kit));
    if (this.made.size === 0) return;
    this.everyRequest = [...this.made.values()];
    const screens = this.everyRequest.filter((step) => step.screen);
    if (screens.length > 0) [this.screens, this.screening] = [screens, true];
  }

  /**
   * The screens' answer for a request, in their order (the first that answers stands); without one,
   * how its rules are to be prepared: `base`, taking a rule a screen prepared as it was, so each
   * rule's resolvers run once per request. At once while every screen answers at once.
   */
  screen(
    rules: readonly RateLimitRule[],
    request: LimitedRequest | undefined,
    base: Prepare,
  ): Screened | Promise<Screened> {
    return this.screenFrom(0, new RequestScreening(rules, request, base, this.kit!));
  }

  private screenFrom(first: number, screening: RequestScreening): Screened | Promise<Screened> {
    for (let i = first; i < this.screens.length; i += 1) {
      const answer = this.screens[i].screen!(screening);
      if (answer instanceof Promise) {
        return answer.then((screened) => screened ?? this.screenFrom(i + 1, screening));
      }
      if (answer !== undefined) return answer;
    }
    return screening.base();
  }

  /** A rule prepared through the steps that prepare it (the first outermost), `base` innermost. */
  prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    base: Prepare,
    request: LimitedRequest | undefined,
  ): ReturnType<Prepare> {
    const steps = this.preparing(rule);
    let next = base;
    for (let i = steps.length - 1; i >= 0; i -= 1) {
      const step = steps[i];
      const inner = next;
      next = (r, t) => step.prepare!(r, t, inner, request);
    }
    return next(rule, thresholds);
  }

  /** The store call `store` through the steps' `consume` (the first outermost). */
  consume(
    steps: readonly LimiterStep[],
    prepared: readonly PreparedRule[],
    store: Consume,
    request: LimitedRequest | undefined,
  ): Promise<ResilientConsumption> {
    let consume = store;
    for (let i = steps.length - 1; i >= 0; i -= 1) {
      const step = steps[i];
      if (!step.consume) continue;
      const next = consume;
      consume = (subset) => step.consume!(subset, next, request);
    }
    return consume(prepared);
  }

  /** The outcome shown to the steps (`decided`, then `refused` if a rule refused), which may add to it. */
  decided(
    steps: readonly LimiterStep[],
    outcome: RateLimitOutcome,
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
  ): RateLimitOutcome {
    for (const step of steps) step.decided?.(outcome, prepared, consumption);
    if (outcome.allowed && outcome.decisions.every((decision) => decision.allowed)) return outcome;
    for (const step of steps) step.refused?.(outcome, prepared, consumption);
    return outcome;
  }

  /** The steps that prepare a rule for a request, in order (the first outermost); nearly always none. */
  private preparing(rule: RateLimitRule): readonly LimiterStep[] {
    let steps = this.preparingRule.get(rule);
    if (!steps) {
      const own = this.forRule(rule).filter((step) => step.prepare);
      steps = own.length === 0 ? NONE : own;
      this.preparingRule.set(rule, steps);
    }
    return steps;
  }

  /** The steps a request of these rules runs, in order; of none (refused before any was prepared), the options'. */
  of(prepared: readonly PreparedRule[]): readonly LimiterStep[] {
    if (this.entries.length === 0) return NONE;
    if (prepared.length === 1) return this.forRule(prepared[0].rule);
    let steps: readonly LimiterStep[] = this.everyRequest;
    for (const { rule } of prepared) {
      const own = this.forRule(rule);
      if (own === steps || own.length === 0) continue;
      steps = steps.length === 0 ? own : this.inOrder((step) => steps.includes(step) || own.includes(step));
    }
    return steps;
  }

  released(keys: readonly string[], how: 'reset' | 'settled', units?: readonly ConditionalUnits[]): void {
    for (const step of this.made.values()) step.released?.(keys, how, units);
  }

  close(): void {
    for (const step of this.made.values()) step.close?.();
  }

  private forRule(rule: RateLimitRule): readonly LimiterStep[] {
    let steps = this.ofRule.get(rule);
    if (!steps) {
      const used: LimiterStep[] = [];
      for (const entry of this.entries) {
        if (entry.uses && !entry.uses(rule)) continue;
        let step = this.made.get(entry);
        if (!step) this.made.set(entry, (step = entry.make(this.kit!)));
        used.push(step);
      }
      // A rule with the options' steps only shares their list: a request of several such rules makes none.
      steps = used.length === 0 ? NONE : used.length === this.everyRequest.length ? this.everyRequest : used;
      this.ofRule.set(rule, steps);
      if (!steps.some((step) => step.prepare || step.consume || step.decided)) this.plain.add(rule);
    }
    return steps;
  }

  private inOrder(kept: (step: LimiterStep) => boolean): LimiterStep[] {
    return this.entries.flatMap((entry) => {
      const step = this.made.get(entry);
      return step && kept(step) ? [step] : [];
    });
  }
}

/** What the screens answer a request: no rule counts it, a refusal, or how to prepare its rules. */
type Screened = RateLimitOutcome | typeof NOT_COUNTED | Prepare;

/** A request as the screens see it; its rules in force found, and prepared, only if a screen asks. */
class RequestScreening implements Screening {
  private inForce: readonly RateLimitRule[] | undefined;
  private known: Map<RateLimitRule, ReturnType<Prepare>> | undefined;

  constructor(
    private readonly all: readonly RateLimitRule[],
    readonly request: LimitedRequest | undefined,
    private readonly given: Prepare,
    private readonly kit: StepKit,
  ) {}

  get rules(): readonly RateLimitRule[] {
    return (this.inForce ??= this.all.filter((rule) => this.kit.thresholdsOf(rule).mode !== 'off'));
  }

  /** A screen may take it apart from the screening (`const { prepared } = screening`). */
  readonly prepared = (rule: RateLimitRule): PreparedRule | Promise<PreparedRule> =>
    this.once(rule, this.kit.thresholdsOf(rule)) as PreparedRule | Promise<PreparedRule>;

  /** How the request's rules are prepared after the screens: as they prepared them, where they did. */
  base(): Prepare {
    return this.known ? this.once : this.given;
  }

  private readonly once: Prepare = (rule, thresholds) => {
    const known = (this.known ??= new Map());
    let prepared = known.get(rule);
    if (prepared === undefined) known.set(rule, (prepared = this.given(rule, thresholds)));
    return prepared;
  };
}

import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import { RateLimitConfigCentre } from './rate-limit-config-centre.js';
import { StoreProblemLog } from '../logging/store-problem-log.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { DecidingStore } from '../resilience/deciding-store.js';
import { RateLimitRuleRegistry, type RateLimitRuleRef } from '../rules/rate-limit-rule.registry.js';
import { RateLimitConfigurationError, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { type RateLimitInspection, inspection } from './rate-limit-inspection.js';
import { Settlements } from './settlements.js';
import { type Consume, NOT_COUNTED, type Prepare } from './limiter-step.js';
import { LimiterSteps } from './limiter-steps.js';
import type { LimitedRequest } from './limited-request.js';
import { HitPreparation, type PreparedRule } from './prepare-hits.js';
import { type RateLimitOutcome, decidedOutcome, rateLimitOutcome } from './rate-limit-outcome.js';

/**
 * Decides requests against all their rules: thresholds (the config centre's only for a rule with a
 * `configKey`), identities, costs and keys first; then one store call that admits on every rule or
 * on none. The guard calls `check` for HTTP; `consume` and `reset` do the same for queues, cron jobs
 * and custom transports.
 */
@Injectable()
export class RateLimiterService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly hits: HitPreparation;
  /** Made by the first outcome that holds units until its request is done (`countOn`, `settleCost`). */
  private settlements: Settlements | undefined;

  /** @internal Nest creates it; a subclass declares no constructor of its own. */
  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    /**
     * By default exactly BlockCacheStore → ResilientStore → RedisRateLimitStore
     * (`module/limiter-provider.ts`); leases are a step, not a layer.
     */
    private readonly store: DecidingStore,
    private readonly problems: StoreProblemLog,
    private readonly registry: RateLimitRuleRegistry,
    configCentre: RateLimitConfigCentre,
    /** The rule features and option parts the module composed (`LimiterStep`). */
    @Optional() private readonly steps: LimiterSteps = new LimiterSteps([]),
  ) {
    const { keyPrefix, ipv6PrefixBits, mode, clock = Date.now } = options;
    this.hits = new HitPreparation(configCentre, keyPrefix, ipv6PrefixBits, mode, clock);
    steps.start(this.hits);
  }

  onApplicationBootstrap(): void {
    this.logger.log(`Rate limiting with the ${this.store.description}`);
  }

  onApplicationShutdown(): void {
    this.steps.close();
    this.problems.close();
  }

  /**
   * Decides one request of a transport (the guard's) against all its rules. Rejects (without
   * counting anything) when an identity or cost resolver throws, e.g. a `BadRequestException` for a
   * missing API key. Outside HTTP: `consume`.
   * @internal
   */
  check(rules: readonly RateLimitRule[], request: LimitedRequest): Promise<RateLimitOutcome> {
    return this.run(rules, request, (rule, thresholds) => this.hits.forRequest(rule, thresholds, request));
  }

  /**
   * Decides one unit of work outside HTTP, as the guard decides a request: every rule admits or
   * none counts. `allowed` says whether to go on; `reported.resetMs` how long to wait otherwise.
   * For rules with `countOn`, call `settle(outcome, succeeded)` once the work is done.
   *
   * @example
   * ```ts
   * const outcome = await limiter.consume('ReportsController.export', tenantId);
   * if (!outcome.allowed) return job.moveToDelayed(Date.now() + outcome.reported!.resetMs);
   * ```
   */
  consume(
    rules: RateLimitRuleRef | readonly RateLimitRuleRef[],
    identity: string,
    cost = 1,
  ): Promise<RateLimitOutcome> {
    let resolved: readonly RateLimitRule[];
    try {
      resolved = this.registry.resolveOutsideHttp(rules, 'consume');
      checkIdentity(identity, 'consume');
      if (!Number.isSafeInteger(cost) || cost < 0) {
        throw new RateLimitConfigurationError(
          `RateLimiterService.consume: 'cost' must be a whole number >= 0, got ${cost}`,
        );
      }
    } catch (error) {
      return Promise.reject(error);
    }
    // The steps as in HTTP, without a request: bans, allowed identities, overrides.
    return this.run(resolved, undefined, (rule, thresholds) => this.hits.forIdentity(rule, thresholds, identity, cost));
  }

  /**
   * Forgets an identity's counts, penalty and admissions in flight under the given rules: its next
   * request starts afresh, on every instance. (An in-process store keeps what it evicted under a
   * flood of identities until that would have ended; see `MemoryRateLimitStore`.)
   */
  async reset(rules: RateLimitRuleRef | readonly RateLimitRuleRef[], identity: string): Promise<void> {
    checkIdentity(identity, 'reset');
    const keys = this.registry.resolveEvery(rules, 'reset').flatMap((rule) => this.hits.keysOf(rule, identity));
    await this.store.reset(keys);
    this.steps.released(keys, 'reset');
  }

  /**
   * An identity's counter under a rule, read without counting anything: units used and left, when
   * the full limit is back, a penalty's time left; under the thresholds in force now. Rejects when
   * the store fails or cannot inspect (a store of your own need not).
   */
  async inspect(rule: RateLimitRuleRef, identity: string): Promise<RateLimitInspection> {
    checkIdentity(identity, 'inspect');
    const [resolved] = this.registry.resolve(rule, 'inspect');
    const base: Prepare = (r, inForce) => this.hits.forIdentity(r, inForce, identity, 0);
    const inForce = this.hits.thresholdsOf(resolved);
    // As the steps count the identity (an override of its own), though an allow list would not count it.
    const prepared = (await this.steps.prepare(resolved, inForce, base, undefined)) ?? base(resolved, inForce);
    const { hit, thresholds, identity: counted } = prepared as PreparedRule;
    const [standing] = await this.store.inspect([hit], this.now());
    return inspection(resolved.name, counted, hit, thresholds.mode, standing);
  }

  /**
   * Ends an admitted request: its `countOn` units are no longer in flight, and those of rules whose
   * `countOn` the response did not meet are refunded. Wakes requests waiting on those units. Never
   * throws; a failed call leaves the request counted (the safe side) and is logged. An outcome
   * settled again gives back nothing more.
   */
  settle(settled: RateLimitOutcome, succeeded: boolean): Promise<void> {
    if (settled.conditional.length === 0) return Promise.resolve();
    return this.settling().countOn(settled, succeeded);
  }

  /**
   * Settles what a request really cost under its rules with `settleCost`: each rule's reservation
   * (its `cost`) against `actual` (a whole number >= 0, or one per rule name). Less is refunded, more
   * charged past the limit if need be (the identity's next requests wait for it), in the call that
   * ends the request's claim in flight (its `settleCost.max`): one store call per rule's slot. Call it once
   * per outcome, also when the work failed (with the reservation, to keep it); the claim otherwise
   * holds the identity's budget for a window. `RateLimitInterceptor` does, with each rule's
   * `settleCost` of the handler's result. Never throws; a failed call leaves the reservation
   * counted (it is logged), and an invalid `actual` too (said once).
   *
   * @example
   * ```ts
   * const outcome = await limiter.consume('completions', tenant, 500); // reserves 500 tokens
   * const answer = await llm.complete(prompt);
   * await limiter.settleCost(outcome, answer.usage.totalTokens);
   * ```
   */
  settleCost(outcome: RateLimitOutcome, actual: number | Readonly<Record<string, number>>): Promise<void> {
    if (outcome.reserved.length === 0) return Promise.resolve();
    return this.settling().cost(outcome, actual);
  }

  private settling(): Settlements {
    return (this.settlements ??= new Settlements(this.store, this.problems, this.steps, () => this.now()));
  }

  /**
   * One store call for all rules (none of them `'off'`), through the steps their features and the
   * module's options composed (`LimiterStep`): a step may wrap the call, and sees the outcome.
   * @param request the transport's; none outside HTTP.
   */
  private decide(prepared: readonly PreparedRule[], request: LimitedRequest | undefined): Promise<RateLimitOutcome> {
    if (prepared.length === 0) return NOT_COUNTED_OUTCOME;
    const { steps } = this;
    if (prepared.every((p) => steps.plain.has(p.rule))) {
      // No step of the rules acts before a refusal (`plain`, see `prepareAll`): straight to the
      // store, the steps see refusals only.
      return this.consumeOf(prepared).then((consumption) => {
        const outcome = decidedOutcome(prepared, consumption);
        if (outcome.allowed && outcome.decisions.every((decision) => decision.allowed)) return outcome;
        return steps.decided(steps.of(prepared), outcome, prepared, consumption);
      });
    }
    const used = steps.of(prepared);
    return steps
      .consume(used, prepared, this.consumeOf, request)
      .then((consumption) => steps.decided(used, decidedOutcome(prepared, consumption), prepared, consumption));
  }

  private readonly consumeOf: Consume = (prepared) => {
    if (prepared.length === 1) return this.store.consume([prepared[0].hit], [prepared[0].rule], this.now());
    return this.store.consume(
      prepared.map((p) => p.hit),
      prepared.map((p) => p.rule),
      this.now(),
    );
  };

  /**
   * Screens a request (`LimiterStep.screen`: bans, the module's exemptions), then prepares its rules
   * in force through their steps around `base`, then decides. Without screens, straight to the rules.
   * @param base a rule prepared as its `by` and `cost` say (the guard's request), or as given (`consume`).
   */
  private run(
    rules: readonly RateLimitRule[],
    request: LimitedRequest | undefined,
    base: Prepare,
  ): Promise<RateLimitOutcome> {
    // A plain field, false by default: with `forRoot({ redis })` and no extension the steps
    // (`limiterSteps` in module/limiter-provider.ts) are the rejection log alone, which hears refusals
    // only; a step screens only for the module's `allow`/`skipIf` or a live centre's bans.
    if (!this.steps.screening) return this.prepareAll(rules, request, base);
    const answer = this.steps.screen(rules, request, base);
    if (!(answer instanceof Promise)) return this.screened(answer, rules, request);
    return answer.then((screened) => this.screened(screened, rules, request));
  }

  /** What a screen answered: no rule counts the request, a refusal, or its rules to prepare. */
  private screened(
    answer: RateLimitOutcome | typeof NOT_COUNTED | Prepare,
    rules: readonly RateLimitRule[],
    request: LimitedRequest | undefined,
  ): Promise<RateLimitOutcome> {
    if (answer === NOT_COUNTED) return NOT_COUNTED_OUTCOME;
    if (answer instanceof Function) return this.prepareAll(rules, request, answer);
    return Promise.resolve(this.steps.decided(this.steps.of([]), answer, [], undefined));
  }

  /** The rules in force prepared; at once (no promise) when every step and resolver answers at once. */
  private prepareAll(
    rules: readonly RateLimitRule[],
    request: LimitedRequest | undefined,
    base: Prepare,
  ): Promise<RateLimitOutcome> {
    const preparing: (PreparedRule | Promise<PreparedRule | null>)[] = [];
    let waits = false;
    try {
      for (const rule of rules) {
        const thresholds = this.hits.thresholdsOf(rule);
        // A rule turned off is not prepared either: its identity and cost resolvers do not run.
        if (thresholds.mode === 'off') continue;
        const { steps } = this;
        // `plain`: rules none of whose steps prepares, consumes or sees admissions, filled on a rule's
        // first request (`LimiterSteps.forRule`; after it no code of that file runs for the rule).
        // A default rule is: compiled with `algorithm: 'fixed-window'`, `countOn: 'all'`, `lease: 0`,
        // `blockMs: 0` and no `mode` (`validateRule`), it uses no feature's step; its one step, the
        // rejection log, hears refusals.
        const prepared = steps.plain.has(rule)
          ? base(rule, thresholds)
          : steps.prepare(rule, thresholds, base, request);
        if (prepared === null) continue;
        if (prepared instanceof Promise) waits = true;
        preparing.push(prepared);
      }
    } catch (error) {
      // The request is refused with this error: what earlier rules still prepare is not awaited.
      for (const p of preparing) if (p instanceof Promise) p.catch(() => undefined);
      return Promise.reject(error);
    }
    if (!waits) return this.decide(preparing as PreparedRule[], request);
    // The rules that count the request: those no step left out (null).
    return Promise.all(preparing).then((all) =>
      this.decide(
        all.filter((p) => p !== null),
        request,
      ),
    );
  }

  /** The module's clock in whole ms, or undefined for the store's own. */
  private now(): number | undefined {
    const { clock } = this.options;
    return clock ? Math.floor(clock()) : undefined;
  }
}

/**
 * A request no rule counts: admitted, with nothing to report (no headers). One promise of one
 * outcome for all of them; nothing reads an outcome to change it.
 */
const NOT_COUNTED_OUTCOME = Promise.resolve(rateLimitOutcome([], true, []));

function checkIdentity(identity: unknown, method: string): void {
  if (typeof identity !== 'string' || identity === '') {
    throw new RateLimitConfigurationError(`RateLimiterService.${method}: 'identity' must be a non-empty string`);
  }
}

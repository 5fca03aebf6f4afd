import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import { EVERY_RULE, type IdentityControls, RateLimitConfigCentre } from './rate-limit-config-centre.js';
import { describeError } from '../logging/describe-error.js';
import { StoreProblemLog } from '../logging/store-problem-log.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { DecidingStore, type ResilientConsumption } from '../resilience/deciding-store.js';
import { RateLimitRuleRegistry, type RateLimitRuleRef } from '../rules/rate-limit-rule.registry.js';
import { RateLimitConfigurationError, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { capacityOf } from '../store/rate-limit-store.js';
import type { AllowList } from '../rules/allow-list.js';
import type { RateLimitInspection } from './rate-limit-inspection.js';
import { CostSettlement } from './cost-settlement.js';
import type { Consume, LimiterStep } from './limiter-step.js';
import { LimiterSteps } from './limiter-steps.js';
import { clientAddressIdentity } from '../store/key-layout.js';
import type { LimitedRequest } from './limited-request.js';
import { HitPreparation, type PreparedRule, Warnings } from './prepare-hits.js';
import { ExemptionProblems, ModuleExemptions } from './exemptions.js';
import {
  type ConditionalUnits,
  type RateLimitOutcome,
  type RuleDecision,
  NO_RESERVED_UNITS,
  rateLimitOutcome,
} from './rate-limit-outcome.js';

/**
 * Decides requests against all their rules: thresholds from the config centre, identities, costs
 * and keys first; then one store call that admits on every rule or on none. The guard calls `check`
 * for HTTP; `consume` and `reset` do the same for queues, cron jobs and custom transports.
 */
@Injectable()
export class RateLimiterService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly hits: HitPreparation;
  private readonly exemptionProblems = new ExemptionProblems();
  private readonly warnings = new Warnings();
  /** Made by the first outcome that reserved units (`settleCost`). */
  private costs: CostSettlement | undefined;
  /** Bans and per-identity overrides, when the config centre keeps them (a live one). */
  private readonly controls: IdentityControls | undefined;
  private readonly clock: () => number;
  /** The module's `allow` and `skipIf`; none when neither is given, and nothing is asked per request. */
  private readonly exemptions: ModuleExemptions | undefined;

  /** @internal Nest creates it; a subclass declares no constructor of its own. */
  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly store: DecidingStore,
    private readonly problems: StoreProblemLog,
    private readonly registry: RateLimitRuleRegistry,
    configCentre: RateLimitConfigCentre,
    /** The rule features and option parts the module composed (`LimiterStep`). */
    @Optional() private readonly steps: LimiterSteps = new LimiterSteps([]),
  ) {
    this.controls = configCentre.identityControls();
    this.clock = options.clock ?? Date.now;
    this.hits = new HitPreparation(
      configCentre,
      options.keyPrefix,
      options.ipv6PrefixBits,
      options.mode,
      this.exemptionProblems,
      this.controls,
      this.clock,
    );
    const { allow, skipIf } = options;
    if (allow || skipIf) {
      this.exemptions = new ModuleExemptions(
        allow?.list,
        allow?.configKey,
        skipIf,
        configCentre,
        this.exemptionProblems,
      );
    }
  }

  onApplicationBootstrap(): void {
    this.logger.log(`Rate limiting with the ${this.store.description}`);
  }

  onApplicationShutdown(): void {
    this.steps.close();
    this.problems.close();
    this.exemptionProblems.close();
  }

  /**
   * Decides one request of a transport (the guard's) against all its rules. Rejects (without
   * counting anything) when an identity or cost resolver throws, e.g. a `BadRequestException` for a
   * missing API key. Outside HTTP: `consume`.
   * @internal
   */
  check(rules: readonly RateLimitRule[], request: LimitedRequest): Promise<RateLimitOutcome> {
    if (this.controls?.anyBans) return this.checkBansFirst(rules, request);
    return this.checkExempting(rules, request);
  }

  /**
   * While any ban is held, a request's identities are looked up before its exemptions: an allow
   * list, a user agent or a `skipIf` never lets a banned identity through. Each rule is prepared
   * once: the decision takes what was prepared here.
   */
  private async checkBansFirst(rules: readonly RateLimitRule[], request: LimitedRequest): Promise<RateLimitOutcome> {
    const identified = new Map<RateLimitRule, PreparedRule>();
    let inForce: RateLimitRule | undefined;
    await Promise.all(
      rules.map(async (rule) => {
        const thresholds = this.hits.thresholdsOf(rule);
        if (thresholds.mode === 'off') return;
        inForce ??= rule;
        try {
          identified.set(rule, await this.hits.forRequest(rule, thresholds, request));
        } catch {
          // Its decision reports the failure, unless an exemption spares the request that resolver.
        }
      }),
    );
    if (!inForce) return this.checkExempting(rules, request, identified);
    return (
      this.bannedOutcome([...identified.values()], request.address, inForce) ??
      this.checkExempting(rules, request, identified)
    );
  }

  /** @param identified rules already prepared (while bans are held), taken as they are. */
  private checkExempting(
    rules: readonly RateLimitRule[],
    request: LimitedRequest,
    identified?: ReadonlyMap<RateLimitRule, PreparedRule>,
  ): Promise<RateLimitOutcome> {
    const { exemptions } = this;
    if (!exemptions) return this.checkRules(rules, request, undefined, identified);
    let skipped: boolean | Promise<boolean>;
    try {
      skipped = exemptions.skipsRequest(request);
    } catch (error) {
      return Promise.reject(error);
    }
    if (skipped === true) return NOT_COUNTED;
    if (skipped === false) return this.checkRules(rules, request, exemptions.list(), identified);
    return skipped.then((skip) =>
      skip ? NOT_COUNTED : this.checkRules(rules, request, exemptions.list(), identified),
    );
  }

  /**
   * @param moduleList the module's allow list in force, for the identities it allows.
   * @param identified rules already prepared (while bans are held), taken as they are.
   */
  private checkRules(
    rules: readonly RateLimitRule[],
    request: LimitedRequest,
    moduleList: AllowList | undefined,
    identified: ReadonlyMap<RateLimitRule, PreparedRule> | undefined,
  ): Promise<RateLimitOutcome> {
    const preparing: (PreparedRule | null | Promise<PreparedRule | null>)[] = [];
    let waits = false;
    try {
      for (const rule of rules) {
        const thresholds = this.hits.thresholdsOf(rule);
        // A rule turned off is not prepared either: its identity and cost resolvers do not run.
        if (thresholds.mode === 'off') continue;
        const known = identified?.get(rule);
        const prepared = this.hits.exempting(rule, thresholds, moduleList)
          ? this.hits.forRequestExempting(rule, thresholds, request, moduleList, known)
          : (known ?? this.hits.forRequest(rule, thresholds, request));
        if (prepared instanceof Promise) waits = true;
        preparing.push(prepared);
      }
    } catch (error) {
      return Promise.reject(error);
    }
    if (!waits) return this.decide(preparing as PreparedRule[], request);
    return Promise.all(preparing).then((prepared) =>
      this.decide(
        prepared.filter((rule): rule is PreparedRule => rule !== null),
        request,
      ),
    );
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
    const prepared: PreparedRule[] = [];
    try {
      const resolved = this.registry.resolve(rules, 'consume');
      checkIdentity(identity, 'consume');
      if (!Number.isSafeInteger(cost) || cost < 0) {
        throw new RateLimitConfigurationError(
          `RateLimiterService.consume: 'cost' must be a whole number >= 0, got ${cost}`,
        );
      }
      for (const rule of resolved) {
        if (typeof rule.maxCost === 'function') {
          throw new RateLimitConfigurationError(
            `RateLimiterService.consume: rule ${rule.name} takes its 'maxCost' from the request (a function), which work outside HTTP has none of; declare it as a number`,
          );
        }
        const thresholds = this.hits.thresholdsOf(rule);
        if (thresholds.mode !== 'off') prepared.push(this.hits.forIdentity(rule, thresholds, identity, cost));
      }
    } catch (error) {
      return Promise.reject(error);
    }
    const banned = this.controls?.anyBans ? this.bannedOutcome(prepared, undefined, undefined) : undefined;
    if (banned) return Promise.resolve(banned);
    // Allowed identities are let through here as in HTTP (addresses and user agents are HTTP's).
    const moduleList = this.exemptions?.list();
    const counted = prepared.filter(
      ({ thresholds, identity: counted }) =>
        !thresholds.allow?.allowsIdentity(counted) && !moduleList?.allowsIdentity(counted),
    );
    return this.decide(counted, undefined);
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
    const {
      hit,
      thresholds,
      identity: counted,
    } = this.hits.forIdentity(resolved, this.hits.thresholdsOf(resolved), identity, 0);
    const [standing] = await this.store.inspect([hit], this.now());
    return {
      rule: resolved.name,
      identity: counted,
      key: hit.key,
      algorithm: hit.algorithm,
      limit: hit.limit,
      windowMs: hit.windowMs,
      mode: thresholds.mode,
      used: Math.max(0, capacityOf(hit) - standing.remaining),
      remaining: standing.remaining,
      resetMs: standing.resetMs,
      blockedMs: standing.blockedMs,
    };
  }

  /**
   * Ends an admitted request: its `countOn` units are no longer in flight, and those of rules whose
   * `countOn` the response did not meet are refunded. Wakes requests waiting on those units. Never
   * throws; a failed call leaves the request counted (the safe side) and is logged.
   */
  async settle(settled: RateLimitOutcome, succeeded: boolean): Promise<void> {
    if (settled.conditional.length === 0) return;
    const settlements = settled.conditional.map(({ countOn, refund }) => ({
      ...refund,
      refund: (countOn === 'success') !== succeeded,
    }));
    try {
      await this.store.settle(settlements);
    } catch (error) {
      const reason = describeError(error);
      this.problems.report(`refund:${reason}`, `Settling countOn units failed (${reason}); they stay counted`);
    } finally {
      this.steps.released(
        settlements.map(({ hit }) => hit.key),
        'settled',
      );
    }
  }

  /**
   * Settles what a request really cost under its rules with `settleCost`: each rule's reservation
   * (its `cost`) against `actual` (a whole number >= 0, or one per rule name). Less is refunded, more
   * charged past the limit if need be (the identity's next requests wait for it), in the call that
   * ends the request's claim in flight (its `maxCost`): one store call per rule's slot. Call it once
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
    this.costs ??= new CostSettlement(this.store, this.problems, this.warnings, () => this.now());
    return this.costs.settle(outcome, actual);
  }

  /**
   * One store call for all rules (none of them `'off'`), through the steps their features and the
   * module's options composed (`LimiterStep`): a step may wrap the call, and sees the outcome.
   * @param request the transport's; none outside HTTP.
   */
  private decide(prepared: readonly PreparedRule[], request: LimitedRequest | undefined): Promise<RateLimitOutcome> {
    if (prepared.length === 0) return Promise.resolve(rateLimitOutcome([], true, []));
    const steps = this.steps.of(prepared);
    let consume: Consume = this.consumeOf;
    for (let i = steps.length - 1; i >= 0; i -= 1) {
      const step = steps[i];
      if (!step.consume) continue;
      const next = consume;
      consume = (subset) => step.consume!(subset, next, request);
    }
    return consume(prepared).then((consumption) => this.decided(steps, prepared, consumption));
  }

  private decided(
    steps: readonly LimiterStep[],
    prepared: readonly PreparedRule[],
    consumption: ResilientConsumption | undefined,
    outcome = this.outcome(prepared, consumption!),
  ): RateLimitOutcome {
    for (const step of steps) step.decided?.(outcome, prepared, consumption);
    if (outcome.allowed && outcome.decisions.every((decision) => decision.allowed)) return outcome;
    for (const step of steps) step.refused?.(outcome, prepared, consumption);
    return outcome;
  }

  private readonly consumeOf: Consume = (prepared) => {
    if (prepared.length === 1) return this.store.consume([prepared[0].hit], [prepared[0].rule], this.now());
    return this.store.consume(
      prepared.map((p) => p.hit),
      prepared.map((p) => p.rule),
      this.now(),
    );
  };

  private outcome(prepared: readonly PreparedRule[], consumption: ResilientConsumption): RateLimitOutcome {
    const fallback = consumption.storeError !== undefined;
    const decisions: RuleDecision[] = [];
    for (let i = 0; i < prepared.length; i += 1) {
      const { rule, identity, thresholds, hit } = prepared[i];
      // Field by field, not spread: decisions of several shapes made the spread a slow path.
      const { allowed, limit, remaining, resetMs, provisional } = consumption.decisions[i];
      const decision: RuleDecision = {
        allowed,
        limit,
        remaining,
        resetMs,
        rule,
        identity,
        windowMs: thresholds.windowMs,
        cost: hit.cost,
        fallback,
        mode: thresholds.mode,
      };
      if (provisional) decision.provisional = true;
      decisions.push(decision);
    }
    return rateLimitOutcome(
      decisions,
      consumption.allowed,
      NO_CONDITIONAL_UNITS,
      consumption.storeError,
      NO_RESERVED_UNITS,
    );
  }

  /**
   * Refused without a store call when an identity the request is counted under is banned by one of
   * its rules (or by every rule, `'*'`), or its client's address is (for HTTP, GraphQL and
   * WebSocket): the ban that ends last says when to retry.
   * @param address the client's, if known.
   * @param inForce a rule of the request in force, to answer an address ban with when no rule
   *   could be prepared (each resolver threw).
   */
  private bannedOutcome(
    prepared: readonly PreparedRule[],
    address: string | undefined,
    inForce: RateLimitRule | undefined,
  ): RateLimitOutcome | undefined {
    const controls = this.controls!;
    const now = this.clock();
    let until = 0;
    let by: PreparedRule | undefined;
    let identity = '';
    for (const p of prepared) {
      const ends = controls.banUntil(p.rule.name, p.identity, now);
      if (ends !== undefined && ends > until) [until, by, identity] = [ends, p, p.identity];
    }
    let byAddress = false;
    if (address) {
      // The address as a `by: 'ip'` rule counts it, so a ban of a client's /64 finds each of its addresses.
      const counted = clientAddressIdentity(address, this.options.ipv6PrefixBits);
      const ends = controls.banUntil(EVERY_RULE, counted, now);
      if (ends !== undefined && ends > until) [until, by, identity, byAddress] = [ends, prepared[0], counted, true];
    }
    if (!by && !byAddress) return undefined;
    const rule = by?.rule ?? inForce!;
    // A '*' ban, when it is the one that ends last: the message names no rule.
    const bannedUnder = byAddress || controls.banUntil(EVERY_RULE, identity, now) === until ? EVERY_RULE : rule.name;
    const thresholds = by?.thresholds ?? this.hits.thresholdsOf(rule);
    const decision: RuleDecision = {
      allowed: false,
      limit: thresholds.count,
      remaining: 0,
      resetMs: until - now,
      rule,
      identity,
      windowMs: thresholds.windowMs,
      cost: by?.hit.cost ?? 0,
      fallback: false,
      mode: 'enforce',
    };
    const outcome = rateLimitOutcome([decision], false, []);
    outcome.banned = true;
    outcome.bannedUnder = bannedUnder;
    return this.decided(this.steps.of([]), [], undefined, outcome);
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
const NOT_COUNTED = Promise.resolve(rateLimitOutcome([], true, []));

/** The `conditional` of nearly every outcome: no rule with `countOn`. */
const NO_CONDITIONAL_UNITS = Object.freeze([]) as unknown as ConditionalUnits[];

function checkIdentity(identity: unknown, method: string): void {
  if (typeof identity !== 'string' || identity === '') {
    throw new RateLimitConfigurationError(`RateLimiterService.${method}: 'identity' must be a non-empty string`);
  }
}

import type { OnApplicationBootstrap, OnApplicationShutdown } from '@nestjs/common';
import type { Histogram, Registry } from 'prom-client';
import type { LiveConfigState } from '../live/redis-config-centre.js';
import type { ConditionalUnits, RateLimitOutcome } from '../limiter/rate-limit-outcome.js';
import { type CircuitBreakerState, RedisTimeoutError } from '../redis/call-safety.js';
import type { StoreObserver } from '../resilience/deciding-store.js';
import type { DecisionObserver, RateLimitDecisionOutcome } from '../limiter/decision-observer.js';
import { isBrokenCircuitError } from 'cockatiel';
import { type PromClient, collectedCounter, liveConfigMetrics } from './collected-metrics.js';

const OUTCOMES: readonly RateLimitDecisionOutcome[] = [
  'allowed',
  'rejected',
  'shadow_rejected',
  'fallback_allowed',
  'fallback_rejected',
];

/** Seconds: a Redis call on loopback takes tens of µs; the deadline is 100 ms by default. */
const STORE_SECONDS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1];
/** A wait for room: from a few milliseconds (a slot given back) to a minute (the longest `wait.maxMs`). */
const WAIT_SECONDS = [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

const BREAKER_STATES: readonly CircuitBreakerState[] = ['closed', 'half-open', 'open'];

/** What the metrics read when scraped, not on the request path. */
export interface MetricsSources {
  circuitState(): CircuitBreakerState | undefined;
  liveConfig(): LiveConfigState | undefined;
  /** The last key audit's count of keys without a TTL, if one ran. */
  keysWithoutTtl(): number | undefined;
  /** The names of the rules declared with `@RateLimit`: all known once the app has started. */
  ruleNames(): Iterable<string>;
  /** Those of them with a `nearLimit` share. */
  nearLimitRuleNames(): Iterable<string>;
  /** The declared concurrency caps' names. */
  capRuleNames(): Iterable<string>;
}

/** Rule names labelled at most; decisions of rules named after them are counted under OTHER_RULES. */
const MAX_RULE_LABELS = 1_000;
const OTHER_RULES = '~other';

/** Index of each outcome in a rule's counts. */
const ALLOWED = 0;
const REJECTED = 1;
const SHADOW_REJECTED = 2;
const FALLBACK_ALLOWED = 3;
const FALLBACK_REJECTED = 4;

/**
 * The limiter's Prometheus metrics. Only the module's provider imports this file: its types are
 * prom-client's, which an app without metrics need not have.
 * Label values are rule names, outcomes and error kinds only,
 * never identities or keys: their number is bounded by the code, not by traffic. On the request
 * path a decision adds 1 to a plain number per rule, brought into the counters when the registry is
 * scraped (prom-client's `inc` hashes its labels on every call: a fifth of a refusal's cost, measured
 * with `npm run bench:core`); a store call is one histogram observation.
 *
 * Every series a scrape may show is there from the start, at 0: every declared rule with every
 * outcome, every error kind. Prometheus's `rate()` and `increase()` count from a series' first
 * sample, so the counts of a series that first appeared at 7 would never be counted. Rules given
 * to `RateLimiterService.consume` as options are known only when used: they appear then, with
 * every outcome at once.
 */
export class RateLimitMetrics
  implements DecisionObserver, StoreObserver, OnApplicationBootstrap, OnApplicationShutdown
{
  private readonly names: string[] = [];
  /** Per rule name, the decisions of each outcome (by the indices above) since the start. */
  private readonly counts = new Map<string, Float64Array>();
  private readonly storeSeconds: Histogram;
  private readonly waitSeconds: Histogram<'rule'>;
  private readonly storeErrors = { timeout: 0, circuit_open: 0, error: 0 };
  private blockCacheHits = 0;
  /** Per rule name, the admissions that crossed its `nearLimit` share. */
  private readonly nearLimits = new Map<string, number>();
  /** Per cap's rule name, the slots this instance holds: requests it admitted still in flight. */
  private readonly slots = new Map<string, number>();

  constructor(
    client: PromClient,
    private readonly registry: Registry,
    prefix: string,
    private readonly sources: MetricsSources,
  ) {
    const registers = [registry];
    const { counts } = this;
    const storeErrors = this.storeErrors;
    const counted = <T extends string>(
      name: string,
      help: string,
      labelNames: readonly T[],
      totals: () => Iterable<[Partial<Record<T, string>>, number]>,
    ) => collectedCounter(client, registers, name, help, labelNames, totals);
    counted(
      `${prefix}decisions_total`,
      'Decisions of each rule, by what the rule did to the request',
      ['rule', 'outcome'],
      function* () {
        for (const [rule, byOutcome] of counts) {
          for (const [i, outcome] of OUTCOMES.entries()) yield [{ rule, outcome }, byOutcome[i]];
        }
      },
    );
    this.storeSeconds = new client.Histogram({
      name: `${prefix}store_duration_seconds`,
      help: 'Time of each call sent to the shared store (Redis), failed ones included; calls refused by the open circuit are not',
      buckets: STORE_SECONDS,
      registers,
    });
    this.waitSeconds = new client.Histogram({
      name: `${prefix}wait_seconds`,
      help: 'How long requests of rules with wait waited for room, admitted or not in the end',
      labelNames: ['rule'],
      buckets: WAIT_SECONDS,
      registers,
    });
    counted(
      `${prefix}store_errors_total`,
      'Failed store calls: timeout (past storeErrors.timeoutMs), circuit_open (not sent), error',
      ['kind'],
      () => Object.entries(storeErrors).map(([kind, total]) => [{ kind }, total] as [{ kind: string }, number]),
    );
    const { nearLimits } = this;
    counted(
      `${prefix}near_limit_total`,
      "Admissions that took an identity's use of a rule to its nearLimit share (once per crossing)",
      ['rule'],
      () => [...nearLimits].map(([rule, total]) => [{ rule }, total] as [{ rule: string }, number]),
    );
    counted(
      `${prefix}block_cache_hits_total`,
      'Requests refused by the local block cache, without a store call',
      [],
      () => [[{}, this.blockCacheHits]],
    );
    const { slots } = this;
    new client.Gauge({
      name: `${prefix}slots_in_flight`,
      help: 'Slots of each concurrency cap this instance holds: requests it admitted that have not ended',
      labelNames: ['rule'],
      registers,
      collect() {
        for (const [rule, held] of slots) this.set({ rule }, held);
      },
    });
    new client.Gauge({
      name: `${prefix}circuit_breaker_state`,
      help: 'The circuit breaker around Redis: 1 for its current state',
      labelNames: ['state'],
      registers,
      collect() {
        const current = sources.circuitState();
        for (const state of BREAKER_STATES) this.set({ state }, current === state ? 1 : 0);
      },
    });
    liveConfigMetrics(client, registers, prefix, () => sources.liveConfig());
    new client.Gauge({
      name: `${prefix}keys_without_ttl`,
      help: 'Keys under the prefix without a TTL at the last background key audit (should be 0)',
      registers,
      collect() {
        const count = sources.keysWithoutTtl();
        if (count !== undefined) this.set(count);
      },
    });
    for (const name of [
      'decisions_total',
      'near_limit_total',
      'store_duration_seconds',
      'wait_seconds',
      'store_errors_total',
      'block_cache_hits_total',
      'slots_in_flight',
      'circuit_breaker_state',
      'config_reloads_total',
      'config_refused_total',
      'config_in_sync',
      'keys_without_ttl',
    ]) {
      this.names.push(`${prefix}${name}`);
    }
  }

  /** The declared rules' series, at 0 until they count (the rule registry has read them by now). */
  onApplicationBootstrap(): void {
    for (const name of this.sources.ruleNames()) this.countsOf(name);
    for (const name of this.sources.nearLimitRuleNames()) this.nearLimits.set(name, 0);
    for (const name of this.sources.capRuleNames()) this.slots.set(name, 0);
  }

  /** Takes its metrics out of the registry, so an app started again in this process can register them. */
  onApplicationShutdown(): void {
    for (const metric of this.registry.getMetricsAsArray()) {
      const { name } = metric as unknown as { name: string };
      if (this.names.includes(name)) this.registry.removeSingleMetric(name);
    }
  }

  /** Counts each rule's decision of one request. */
  decided(outcome: RateLimitOutcome): void {
    for (const decision of outcome.decisions) {
      const byOutcome = this.countsOf(decision.rule.name);
      let counted: number;
      if (!decision.allowed && decision.mode === 'shadow') counted = SHADOW_REJECTED;
      else if (decision.fallback) counted = decision.allowed ? FALLBACK_ALLOWED : FALLBACK_REJECTED;
      else counted = decision.allowed ? ALLOWED : REJECTED;
      byOutcome[counted] += 1;
      if (decision.nearLimit) this.nearLimitCrossed(decision.rule.name);
    }
    if (outcome.conditional.length > 0) this.slotsChanged(outcome.conditional, 1);
    if (outcome.waitedMs !== undefined) {
      const rule = outcome.decisions.find((decision) => decision.rule.wait !== undefined)?.rule.name ?? OTHER_RULES;
      this.waitSeconds.observe({ rule: this.counts.has(rule) ? rule : OTHER_RULES }, outcome.waitedMs / 1000);
    }
  }

  settled(units: readonly ConditionalUnits[]): void {
    this.slotsChanged(units, -1);
  }

  private slotsChanged(units: readonly ConditionalUnits[], by: 1 | -1): void {
    for (const { rule, countOn } of units) {
      if (countOn === 'release') this.slots.set(rule.name, (this.slots.get(rule.name) ?? 0) + by);
    }
  }

  private nearLimitCrossed(name: string): void {
    const labelled = this.nearLimits.has(name) || this.nearLimits.size < MAX_RULE_LABELS ? name : OTHER_RULES;
    this.nearLimits.set(labelled, (this.nearLimits.get(labelled) ?? 0) + 1);
  }

  called(seconds: number, error: unknown): void {
    // Refused by the open circuit in this process, in microseconds: no time of Redis's. Timed, such
    // calls would pull the histogram's quantiles down just when Redis is slowest.
    if (isBrokenCircuitError(error)) {
      this.storeErrors.circuit_open += 1;
      return;
    }
    this.storeSeconds.observe(seconds);
    if (error === undefined) return;
    if (error instanceof RedisTimeoutError) this.storeErrors.timeout += 1;
    else this.storeErrors.error += 1;
  }

  blockCacheHit(): void {
    this.blockCacheHits += 1;
  }

  /** A rule's counts by outcome, made at 0 for a name first met. */
  private countsOf(name: string): Float64Array {
    let byOutcome = this.counts.get(name);
    if (byOutcome) return byOutcome;
    // Rules given to `consume` as options may take names from data: past the bound, one series.
    const labelled = this.counts.size < MAX_RULE_LABELS ? name : OTHER_RULES;
    byOutcome = this.counts.get(labelled) ?? new Float64Array(OUTCOMES.length);
    this.counts.set(labelled, byOutcome);
    return byOutcome;
  }
}

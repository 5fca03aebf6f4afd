import {
  type ExecutionContext,
  HttpException,
  Inject,
  InternalServerErrorException,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { clientAddressIdentity } from './client-address.js';
import { RateLimitConfigCentre } from '../config-centre/rate-limit-config-centre.js';
import { RuleThresholds, type Thresholds } from '../config-centre/rule-thresholds.js';
import { SampledLogger } from '../logging/sampled-logger.js';
import type { ConditionalUnits, RateLimitOutcome, RuleDecision } from './rate-limit-outcome.js';
import { InFlightWaits } from './in-flight-waits.js';
import { ANONYMOUS_IDENTITY, rateLimitKeys } from '../store/key-layout.js';
import { DEFAULT_LOG_MAX_TRACKED } from '../decorators/metadata-keys.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import { neverReachedRedis } from '../redis/unsent-error.js';
import { LocalFallback } from '../resilience/local-fallback.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import {
  type RateLimitConsumption,
  type RateLimitHit,
  RateLimitStore,
  windowStartOf,
} from '../store/rate-limit-store.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';

/** nginx's status for a client that closed the connection first; nobody receives it, logs show it. */
const CLIENT_CLOSED = 499;

/** Retry-After for requests refused because the store failed under `onStoreError: 'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

/** Requests that wait per key for `countOn` units in flight; more are refused at once, without a penalty. */
const IN_FLIGHT_WAITERS_PER_KEY = 100;

/** A rule made concrete for one request. */
interface PreparedRule {
  rule: RateLimitRule;
  /** `null` when the resolver gave none: the rule's anonymous counter. */
  identity: string | null;
  thresholds: Thresholds;
  hit: RateLimitHit;
}

/**
 * Decides a request against all its rules: thresholds from the config centre, identities, costs
 * and keys first; then one store call that admits on every rule or on none. Store failures are
 * decided by `onStoreError`; rejections are logged by sampling.
 */
@Injectable()
export class RateLimiterService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly thresholds: RuleThresholds;
  private readonly rejections: SampledLogger | undefined;
  private readonly storeErrors: SampledLogger;
  private readonly warned = new Set<string>();
  private readonly inFlight = new InFlightWaits(IN_FLIGHT_WAITERS_PER_KEY);
  /** For `onStoreError: 'local'`; only a shared store (Redis) can fail in a way it covers. */
  private readonly fallback: LocalFallback | undefined;

  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    private readonly store: RateLimitStore,
    configCentre: RateLimitConfigCentre,
  ) {
    this.thresholds = new RuleThresholds(configCentre);
    if (!(store instanceof MemoryRateLimitStore)) {
      this.fallback = new LocalFallback({ ...options.localFallback, maxKeys: options.memoryStoreMaxKeys });
    }
    const { logging } = options;
    if (logging) {
      this.rejections = new SampledLogger(this.logger, {
        ...logging,
        maxKeys: DEFAULT_LOG_MAX_TRACKED,
        summary: 'Rejected requests of other keys',
      });
    }
    this.storeErrors = new SampledLogger(this.logger, {
      intervalMs: logging ? logging.intervalMs : 10_000,
      maxLinesPerSecond: 1,
      maxKeys: 100,
      level: 'error',
      summary: 'Rate-limit store failed',
    });
  }

  onApplicationBootstrap(): void {
    this.logger.log(`Rate limiting with the ${this.store.description}`);
  }

  onApplicationShutdown(): void {
    this.rejections?.close();
    this.storeErrors.close();
  }

  /**
   * Decides one request against all its rules. Rejects (without counting anything) when an
   * identity or cost resolver throws, e.g. a `BadRequestException` for a missing API key.
   */
  async check(rules: readonly RateLimitRule[], context: ExecutionContext): Promise<RateLimitOutcome> {
    const prepared = await Promise.all(rules.map((rule) => this.prepare(rule, context)));
    const hits = prepared.map((p) => p.hit);
    const waitUntil = performance.now() + this.options.inFlightWaitMs;
    for (let attempt = 0; ; attempt += 1) {
      const now = this.now();
      let consumption: RateLimitConsumption;
      try {
        consumption = await this.store.consume(hits, now);
      } catch (error) {
        return this.onStoreError(prepared, error, now ?? Date.now());
      }
      const inFlight = keysInFlight(hits, consumption);
      const left = waitUntil - performance.now();
      // Backs off from 10 ms to 160 ms between asks, for admissions other instances settle unseen.
      if (
        inFlight &&
        left > 0 &&
        !clientGone(context) &&
        (await this.inFlight.wait(inFlight, Math.min(left, 10 * 2 ** Math.min(attempt, 4))))
      ) {
        continue;
      }
      return this.decided(prepared, consumption, now);
    }
  }

  /** Turns the store's decisions into the request's outcome, after the lost-write check. */
  private async decided(
    prepared: readonly PreparedRule[],
    consumption: RateLimitConsumption,
    now: number | undefined,
  ): Promise<RateLimitOutcome> {
    const hits = prepared.map((p) => p.hit);
    if (consumption.replicated === false) {
      this.storeErrors.record('wait', 'Fewer replicas than waitForReplicas asks confirmed the counts in time');
    }
    if (this.fallback) {
      const at = now ?? Date.now();
      if (this.options.detectLostWrites && this.store instanceof RedisRateLimitStore) {
        consumption = await this.guardAgainstLostWrites(prepared, consumption, at);
      }
      this.fallback.remember(hits, consumption, at);
      if (this.fallback.hasPending) void this.recordFallbackUnits(now);
    }
    const decisions = prepared.map(({ rule, identity }, i): RuleDecision => {
      const decision = consumption.decisions[i];
      if (decision.repaired) {
        this.storeErrors.record(
          `repaired:${rule.name}`,
          `Mended a key of rule ${rule.name} found corrupt or without a TTL (${hits[i].key}, among others)`,
        );
      }
      return {
        ...decision,
        rule,
        identity: identity ?? ANONYMOUS_IDENTITY,
        windowMs: prepared[i].thresholds.windowMs,
        cost: prepared[i].hit.cost,
        fallback: false,
      };
    });
    if (!consumption.allowed && this.rejections) {
      for (const [i, decision] of decisions.entries()) {
        if (!decision.allowed) {
          const { hit } = prepared[i];
          this.rejections.record(
            hit.key,
            `Rejected by rule ${decision.rule.name} (${hit.limit} per ${hit.windowMs} ms, ${hit.algorithm}), key ${hit.key}`,
          );
        }
      }
    }
    const conditional: ConditionalUnits[] = [];
    if (consumption.receipts) {
      prepared.forEach(({ rule, hit }, i) => {
        if (rule.countOn !== 'all') {
          conditional.push({ countOn: rule.countOn, refund: { hit, receipt: consumption.receipts![i] } });
        }
      });
    }
    return outcome(decisions, consumption.allowed, conditional);
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
      this.storeErrors.record(`refund:${reason}`, `Settling countOn units failed (${reason}); they stay counted`);
    } finally {
      this.inFlight.settled(settlements.map(({ hit }) => hit.key));
    }
  }

  /**
   * Redis reported clearly less for a fixed window than this instance saw in it: writes were lost
   * (a failover to a replica that lacked them). Decides on the higher figure, raises the counter in
   * Redis to it, and if the higher figure refuses the request, takes back what Redis admitted.
   * Differences within `max(2, 5% of the limit)` are let be: other instances' refunds (Cluster
   * slot groups) lower a count by a few units. Rules with `countOn` are not checked, since their
   * refunds lower counts by design.
   */
  private async guardAgainstLostWrites(
    prepared: readonly PreparedRule[],
    consumption: RateLimitConsumption,
    at: number,
  ): Promise<RateLimitConsumption> {
    const store = this.store as RedisRateLimitStore;
    const raises: { hit: RateLimitHit; windowStart: number; figure: number }[] = [];
    let refused = false;
    const decisions = consumption.decisions.map((decision, i) => {
      const { hit, rule } = prepared[i];
      if (rule.countOn !== 'all' || consumption.decidedAt?.[i] === undefined) return decision;
      const lost = this.fallback!.lostUnits(hit, consumption, i, at);
      if (lost < Math.max(2, Math.ceil(hit.limit * 0.05))) return decision;
      const seen = this.fallback!.seenUnits(hit);
      const figure = seen + (consumption.allowed ? hit.cost : 0);
      this.storeErrors.record(
        `lost:${hit.key}`,
        `Redis lost writes of ${hit.key} (a failover?); counting on the higher figure`,
      );
      const allowed = decision.allowed && figure <= hit.limit;
      if (consumption.allowed && !allowed) refused = true;
      // The window the decision was made in (lost units are only ever counted for fixed windows).
      raises.push({ hit, windowStart: windowStartOf(hit, consumption, i)!, figure });
      return { ...decision, allowed, remaining: Math.max(0, hit.limit - figure) };
    });
    if (raises.length === 0) return consumption;
    if (refused) {
      // This request is taken back: the figures to keep leave it out.
      for (const raise of raises) raise.figure -= raise.hit.cost;
    }
    try {
      if (refused) {
        const receipts = consumption.receipts!;
        await store.refund(prepared.map(({ hit }, i) => ({ hit, receipt: receipts[i] })));
      }
      for (const { hit, windowStart, figure } of raises) await store.raiseFixedWindow(hit, windowStart, figure);
    } catch {
      // Best effort: the decision below stands either way.
    }
    if (refused) {
      // Remember what Redis now holds, without the refused request.
      return {
        allowed: false,
        decisions: decisions.map((decision, i) => {
          const raise = raises.find((r) => r.hit === prepared[i].hit);
          return raise ? { ...decision, remaining: Math.max(0, raise.hit.limit - raise.figure) } : decision;
        }),
        receipts: undefined,
      };
    }
    return { ...consumption, decisions };
  }

  /**
   * Redis answers again: records in it what the fallback admitted meanwhile (for windows not over
   * yet), so those requests count against the limit there too. Never throws.
   */
  private async recordFallbackUnits(now: number | undefined): Promise<void> {
    const hits = this.fallback!.takePending(now ?? Date.now());
    try {
      for (let i = 0; i < hits.length; i += 100) await this.store.record(hits.slice(i, i + 100), now);
    } catch (error) {
      const reason = describeError(error);
      this.storeErrors.record(`record:${reason}`, `Recording requests the fallback admitted failed (${reason})`);
    }
  }

  /** The module's clock in whole ms, or undefined for the store's own. */
  private now(): number | undefined {
    const { clock } = this.options;
    return clock ? Math.floor(clock()) : undefined;
  }

  private async prepare(rule: RateLimitRule, context: ExecutionContext): Promise<PreparedRule> {
    const thresholds = this.thresholds.resolve(rule);
    const [identity, cost] = await Promise.all([this.identify(rule, context), this.costOf(rule, context)]);
    const { key, blockKey, markerKey, pendingKey } = rateLimitKeys(
      this.options.keyPrefix,
      rule.name,
      identity,
      rule.algorithm,
    );
    const { lostWriteMarker } = this.options;
    return {
      rule,
      identity,
      thresholds,
      hit: {
        key,
        blockKey,
        markerKey,
        pendingKey,
        conditional: rule.countOn !== 'all',
        markFrom:
          lostWriteMarker && rule.algorithm === 'fixed-window'
            ? Math.max(1, Math.ceil(thresholds.count * lostWriteMarker))
            : 0,
        algorithm: rule.algorithm,
        limit: thresholds.count,
        windowMs: thresholds.windowMs,
        cost,
        burst: rule.burst ?? thresholds.count,
        blockMs: rule.blockMs,
      },
    };
  }

  private async identify(rule: RateLimitRule, context: ExecutionContext): Promise<string | null> {
    const { by } = rule;
    if (by === 'global') return 'global';
    if (by === 'ip') {
      const request = context
        .switchToHttp()
        .getRequest<{ ip?: string; socket?: { remoteAddress?: string; destroyed?: boolean } }>();
      const address = request.ip ?? request.socket?.remoteAddress;
      if (!address) throw this.noClientAddress(rule, request.socket?.destroyed ?? true);
      return clientAddressIdentity(address, this.options.ipv6PrefixBits);
    }
    const identity: unknown = await by(context);
    if (typeof identity === 'string' && identity !== '') return identity;
    if (typeof identity === 'number' && Number.isFinite(identity)) return String(identity);
    this.warnOnce(
      `identity:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: 'by' returned ${identity === '' ? 'an empty string' : describeValue(identity)}; ` +
        `such requests share one '${ANONYMOUS_IDENTITY}' counter of rule ${rule.name}. Throw an HttpException from 'by' to refuse them instead`,
    );
    return null;
  }

  private async costOf(rule: RateLimitRule, context: ExecutionContext): Promise<number> {
    const { cost } = rule;
    if (typeof cost === 'number') return cost;
    const value: unknown = await cost(context);
    if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return value;
    this.warnOnce(
      `cost:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: 'cost' returned ${describeValue(value)}, not a whole number >= 0; counting 1`,
    );
    return 1;
  }

  /**
   * Never a shared 'unknown' counter that one client could exhaust for all, and never an unknown
   * error, which Nest logs with its stack for every request: a client resetting its connections
   * must not write a line each. A closed connection (the client went away before the decision) is
   * refused quietly, uncounted, and its handler never runs. An open one without an address is a
   * server listening where sockets have none (a Unix socket without `trust proxy`): said once.
   */
  private noClientAddress(rule: RateLimitRule, closed: boolean): HttpException {
    if (closed) return new HttpException('The connection closed before the request was decided', CLIENT_CLOSED);
    this.warnOnce(
      `address:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: requests have no client address (a Unix socket? set 'trust proxy' so req.ip names the client); they are refused with 500`,
    );
    return new InternalServerErrorException('The client address is unknown');
  }

  /** A misconfiguration is reported once, not per request; the set is bounded by the rules. */
  private warnOnce(id: string, message: string): void {
    if (this.warned.has(id) || this.warned.size >= 1_000) return;
    this.warned.add(id);
    this.logger.warn(message);
  }

  /**
   * Decides a request the store could not: each rule by its `onStoreError` (or the module's).
   * A `'deny'` rule refuses; otherwise `'local'` rules are decided together by this instance and
   * `'allow'` rules admit.
   */
  private async onStoreError(
    prepared: readonly PreparedRule[],
    error: unknown,
    now: number,
  ): Promise<RateLimitOutcome> {
    const policies = prepared.map(({ rule }) => rule.onStoreError ?? this.options.onStoreError);
    const reason = describeError(error);
    const summary = [...new Set(policies)].join('/');
    this.storeErrors.record(
      reason,
      `Rate-limit store failed (${reason}); requests decided by onStoreError '${summary}'`,
    );

    const denied = policies.includes('deny');
    const localIndices = denied ? [] : policies.flatMap((policy, i) => (policy === 'local' ? [i] : []));
    const local =
      localIndices.length > 0 && this.fallback
        ? await this.fallback.consume(
            localIndices.map((i) => prepared[i].hit),
            now,
            neverReachedRedis(error),
          )
        : undefined;
    const allowed = !denied && (local?.allowed ?? true);
    const decisions = prepared.map(({ rule, identity, thresholds }, i): RuleDecision => {
      const base = {
        rule,
        identity: identity ?? ANONYMOUS_IDENTITY,
        windowMs: thresholds.windowMs,
        cost: prepared[i].hit.cost,
        fallback: true,
        limit: thresholds.count,
      };
      const localAt = localIndices.indexOf(i);
      if (local && localAt >= 0) return { ...local.decisions[localAt], ...base };
      return policies[i] === 'deny' || (policies[i] === 'local' && !allowed)
        ? { ...base, allowed: policies[i] !== 'deny' && allowed, remaining: 0, resetMs: STORE_ERROR_RETRY_MS }
        : { ...base, allowed: true, remaining: thresholds.count, resetMs: thresholds.windowMs };
    });
    return { ...outcome(decisions, allowed, []), storeError: policyOf(policies) };
  }
}

/**
 * Whether the client closed its connection: a request whose client left while it waited stops
 * waiting, and is refused like any connection closed before the decision (its handler never runs).
 */
function clientGone(context: ExecutionContext): boolean {
  const request = context.switchToHttp().getRequest<{ socket?: { destroyed?: boolean } }>();
  return request.socket?.destroyed === true;
}

/**
 * The keys to wait on when every rule that rejected did so only because of `countOn` units still in
 * flight; undefined when the request is admitted or some rejection is final.
 */
function keysInFlight(hits: readonly RateLimitHit[], consumption: RateLimitConsumption): string[] | undefined {
  if (consumption.allowed) return undefined;
  const keys: string[] = [];
  for (const [i, decision] of consumption.decisions.entries()) {
    if (decision.allowed) continue;
    if (!decision.provisional) return undefined;
    keys.push(hits[i].key);
  }
  return keys;
}

/** The policy that decided a request the store could not: 'deny' if any rule denies. */
function policyOf(policies: readonly RateLimitStoreErrorPolicy[]): RateLimitStoreErrorPolicy {
  if (policies.includes('deny')) return 'deny';
  return policies.includes('local') ? 'local' : 'allow';
}

/** Picks the decision the headers report: the rejecting rule with the longest wait, else the tightest rule. */
function outcome(
  decisions: readonly RuleDecision[],
  allowed: boolean,
  conditional: readonly ConditionalUnits[],
): RateLimitOutcome {
  let reported: RuleDecision | undefined;
  for (const decision of decisions) {
    if (decision.fallback && allowed) continue;
    if (!allowed) {
      if (!decision.allowed && (!reported || decision.resetMs > reported.resetMs)) reported = decision;
    } else if (!reported || tighter(decision, reported)) {
      reported = decision;
    }
  }
  return { decisions, reported, allowed, conditional };
}

function tighter(a: RuleDecision, b: RuleDecision): boolean {
  return a.remaining < b.remaining || (a.remaining === b.remaining && a.resetMs > b.resetMs);
}

function describeValue(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (value === null || value === undefined || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

/** An error for a log line: its class (cockatiel's errors all have the name 'Error') and message. */
function describeError(error: unknown): string {
  return error instanceof Error ? `${error.constructor.name}: ${error.message}` : String(error);
}

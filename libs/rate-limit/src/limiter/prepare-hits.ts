import { HttpException, InternalServerErrorException } from '@nestjs/common';
import type { RateLimitOverride } from './limit-values.js';
import { ALGORITHM_NAMES } from '../algorithms/algorithm.js';
import type { RateLimitMode, RateLimitRule } from '../rules/rate-limit-rule.js';
import { ANONYMOUS_IDENTITY, clientAddressIdentity, ruleStateKey } from '../store/key-layout.js';
import type { RateLimitHit } from '../store/rate-limit-store.js';
import type { LimitedRequest } from './limited-request.js';
import { describeValue } from '../rules/describe-value.js';
import { type LimitValuesSource, RuleThresholds, type Thresholds, Warnings } from './rule-thresholds.js';

export type { Thresholds } from './rule-thresholds.js';

/** nginx's status for a client that closed the connection first; nobody receives it, logs show it. */
const CLIENT_CLOSED = 499;

/** A rule made concrete for one request. */
export interface PreparedRule {
  rule: RateLimitRule;
  /** As it appears in decisions: `~anonymous` when the resolver gave none. */
  identity: string;
  thresholds: Thresholds;
  hit: RateLimitHit;
}

/**
 * Makes a rule concrete for one request: the thresholds in force (the decorator's; for a rule with
 * a `configKey`, the config centre's, read on every request so a change applies at once), the
 * identity, the cost, and the state key. What the limiter lends its steps (`StepKit`).
 */
export class HitPreparation {
  private readonly thresholds: RuleThresholds;
  private readonly warnings = new Warnings();
  /** The thresholds of rules without a config key: the decorator's, which never change. */
  private readonly fixed = new WeakMap<RateLimitRule, Thresholds>();

  constructor(
    configCentre: LimitValuesSource,
    private readonly keyPrefix: string,
    private readonly ipv6PrefixBits: number,
    moduleMode: RateLimitMode,
    /** The module's clock. */
    readonly now: () => number = Date.now,
  ) {
    this.thresholds = new RuleThresholds(configCentre, moduleMode);
  }

  /**
   * For an HTTP request: identity and cost from the rule's `by` and `cost`. At once (no promise) for
   * `by: 'ip' | 'global'` with a fixed cost, most rules (a default rule: `by: 'ip'`, `cost: 1`):
   * promises per rule per request add up.
   */
  forRequest(
    rule: RateLimitRule,
    thresholds: Thresholds,
    request: LimitedRequest,
  ): PreparedRule | Promise<PreparedRule> {
    const { by, cost, maxCost } = rule;
    if (typeof by !== 'function' && typeof cost === 'number' && typeof maxCost !== 'function') {
      return this.prepared(rule, thresholds, by === 'global' ? 'global' : this.clientAddress(rule, request), cost);
    }
    return Promise.all([this.identify(rule, request), this.costOf(rule, request)]).then(async ([identity, resolved]) =>
      this.prepared(rule, thresholds, identity, resolved, await this.maxCostOf(rule, request, resolved)),
    );
  }

  /**
   * The thresholds in force for a rule now: the decorator's, kept per rule; for a rule with a
   * `configKey`, the config centre's where valid. First, so that a rule turned `'off'` is not
   * prepared at all (its resolvers do not run).
   */
  thresholdsOf(rule: RateLimitRule): Thresholds {
    return this.fixed.get(rule) ?? this.resolve(rule);
  }

  private resolve(rule: RateLimitRule): Thresholds {
    const thresholds = this.thresholds.resolve(rule);
    if (rule.configKey === undefined) this.fixed.set(rule, thresholds);
    return thresholds;
  }

  thresholdsWith(rule: RateLimitRule, values: RateLimitOverride): Thresholds {
    return this.thresholds.forIdentity(rule, values);
  }

  withThresholds(prepared: PreparedRule, thresholds: Thresholds): PreparedRule {
    const { rule, identity, hit } = prepared;
    const maxCost = hit.overdraftBound === undefined ? undefined : hit.overdraftBound + hit.cost;
    return this.prepared(rule, thresholds, identity === ANONYMOUS_IDENTITY ? null : identity, hit.cost, maxCost);
  }

  clientIdentity(address: string): string {
    return clientAddressIdentity(address, this.ipv6PrefixBits);
  }

  /** Outside HTTP: the identity and cost as the caller gives them (see `identityOf`). */
  forIdentity(rule: RateLimitRule, thresholds: Thresholds, identity: string, cost: number): PreparedRule {
    return this.prepared(rule, thresholds, this.identityOf(rule, identity), cost);
  }

  /**
   * The state keys of a rule for an identity, as `forIdentity` counts it: under every algorithm,
   * since a config centre may switch the rule's (and back), and a reset must leave none behind.
   */
  keysOf(rule: RateLimitRule, identity: string): string[] {
    const counted = this.identityOf(rule, identity);
    return ALGORITHM_NAMES.map((algorithm) => ruleStateKey(this.keyPrefix, rule.keyId, counted, algorithm));
  }

  /**
   * A given identity as the rule's own `by` would count it, so the API and HTTP share counters: a
   * `'global'` rule has one, and a `by: 'ip'` rule takes a client address (IPv6 counted per prefix).
   */
  private identityOf(rule: RateLimitRule, identity: string): string {
    if (rule.by === 'global') return 'global';
    return rule.by === 'ip' ? clientAddressIdentity(identity, this.ipv6PrefixBits) : identity;
  }

  /**
   * @param maxCost a `settleCost` rule's most for this request (its `settleCost.max`); undefined for other
   *   rules.
   */
  private prepared(
    rule: RateLimitRule,
    thresholds: Thresholds,
    identity: string | null,
    cost: number,
    maxCost = typeof rule.maxCost === 'number' ? rule.maxCost : undefined,
  ): PreparedRule {
    return {
      rule,
      identity: identity ?? ANONYMOUS_IDENTITY,
      thresholds,
      hit: {
        // The algorithm is part of the key: one a config centre switches to starts afresh, and
        // never reads another's state.
        key: ruleStateKey(this.keyPrefix, rule.keyId, identity, thresholds.algorithm),
        conditional: rule.countOn !== 'all',
        slot: rule.concurrency !== undefined,
        waitedOn: rule.wait !== undefined,
        algorithm: thresholds.algorithm,
        limit: thresholds.count,
        windowMs: thresholds.windowMs,
        cost,
        burst: thresholds.burst,
        blockMs: rule.blockMs,
        overdraftBound: maxCost === undefined ? undefined : Math.max(0, maxCost - cost),
      },
    };
  }

  /** The client's address: of the HTTP request (a GraphQL operation's too), or of a WebSocket client. */
  private clientAddress(rule: RateLimitRule, request: LimitedRequest): string {
    const { address } = request;
    if (!address) throw this.noClientAddress(rule, request.gone());
    return this.clientIdentity(address);
  }

  private async identify(rule: RateLimitRule, request: LimitedRequest): Promise<string | null> {
    const { by } = rule;
    if (by === 'global') return 'global';
    if (by === 'ip') return this.clientAddress(rule, request);
    const identity: unknown = await by(request.context);
    if (typeof identity === 'string' && identity !== '') return identity;
    if (typeof identity === 'number' && Number.isFinite(identity)) return String(identity);
    this.warnings.once(
      `identity:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: 'by' returned ${identity === '' ? 'an empty string' : describeValue(identity, 40)} (it runs after the app's guards, so it sees what they set); ` +
        `such requests share one '${ANONYMOUS_IDENTITY}' counter of rule ${rule.name}. To count them apart, fall back to their address (req.user?.id ?? req.ip); to refuse them, throw an HttpException from 'by'`,
    );
    return null;
  }

  private async costOf(rule: RateLimitRule, request: LimitedRequest): Promise<number> {
    const { cost } = rule;
    if (typeof cost === 'number') return cost;
    return this.unitsOf(rule, 'cost', await cost(request.context), 1, 'counting 1');
  }

  /** A `settleCost` rule's most for this request; its cost (nothing more held in flight) when that fails. */
  private async maxCostOf(rule: RateLimitRule, request: LimitedRequest, cost: number): Promise<number | undefined> {
    const { maxCost } = rule;
    if (typeof maxCost !== 'function') return maxCost;
    return this.unitsOf(
      rule,
      'settleCost.max',
      await maxCost(request.context),
      cost,
      'such requests hold only their reservation in flight, and may overdraw the budget together',
    );
  }

  /** What a rule's units function returned, if a whole number >= 0; else `fallback`, said once. */
  private unitsOf(rule: RateLimitRule, field: string, value: unknown, fallback: number, instead: string): number {
    if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return value;
    this.warnings.once(
      `${field}:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: '${field}' returned ${describeValue(value, 40)}, not a whole number >= 0; ${instead}`,
    );
    return fallback;
  }

  /**
   * Never a shared 'unknown' counter that one client could exhaust for all, and never an unknown
   * error, which Nest logs with its stack for every request: a client resetting its connections
   * must not write a line each. A closed connection (the client went away before the decision) is
   * refused quietly, uncounted, and its handler never runs. An open one without an address is a
   * server listening where sockets have none (a Unix socket without `trust proxy`), or a GraphQL
   * context built without its request: said once.
   */
  private noClientAddress(rule: RateLimitRule, closed: boolean): HttpException {
    if (closed) return new HttpException('The connection closed before the request was decided', CLIENT_CLOSED);
    this.warnings.once(
      `address:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: requests have no client address (a Unix socket? set 'trust proxy' so req.ip names the client); they are refused with 500`,
    );
    return new InternalServerErrorException('The client address is unknown');
  }
}

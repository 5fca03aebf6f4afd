import { type ExecutionContext, HttpException, InternalServerErrorException, Logger } from '@nestjs/common';
import type { RateLimitConfigCentre } from './rate-limit-config-centre.js';
import { RuleThresholds, type Thresholds } from './rule-thresholds.js';
import { ALGORITHM_NAMES } from '../algorithms/algorithm.js';
import type { RateLimitMode, RateLimitRule } from '../rules/rate-limit-rule.js';
import { ANONYMOUS_IDENTITY, ruleStateKey } from '../store/key-layout.js';
import type { RateLimitHit } from '../store/rate-limit-store.js';
import { clientAddressIdentity } from './client-address.js';
import { clientOf } from '../transports/limited-context.js';

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
 * identity, the cost, and the state key.
 */
export class HitPreparation {
  private readonly logger = new Logger('RateLimit');
  private readonly thresholds: RuleThresholds;
  private readonly warned = new Set<string>();

  constructor(
    configCentre: RateLimitConfigCentre,
    private readonly keyPrefix: string,
    private readonly ipv6PrefixBits: number,
    moduleMode: RateLimitMode,
  ) {
    this.thresholds = new RuleThresholds(configCentre, moduleMode);
  }

  /**
   * For an HTTP request: identity and cost from the rule's `by` and `cost`. At once (no promise) for
   * `by: 'ip' | 'global'` with a fixed cost, most rules: promises per rule per request add up.
   */
  forRequest(
    rule: RateLimitRule,
    thresholds: Thresholds,
    context: ExecutionContext,
  ): PreparedRule | Promise<PreparedRule> {
    const { by, cost } = rule;
    if (typeof by !== 'function' && typeof cost === 'number') {
      return this.prepared(rule, thresholds, by === 'global' ? 'global' : this.clientAddress(rule, context), cost);
    }
    return Promise.all([this.identify(rule, context), this.costOf(rule, context)]).then(([identity, resolved]) =>
      this.prepared(rule, thresholds, identity, resolved),
    );
  }

  /**
   * The thresholds in force for a rule now: the decorator's, kept per rule; for a rule with a
   * `configKey`, the config centre's where valid. First, so that a rule turned `'off'` is not
   * prepared at all (its resolvers do not run).
   */
  thresholdsOf(rule: RateLimitRule): Thresholds {
    return this.thresholds.resolve(rule);
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

  private prepared(rule: RateLimitRule, thresholds: Thresholds, identity: string | null, cost: number): PreparedRule {
    return {
      rule,
      identity: identity ?? ANONYMOUS_IDENTITY,
      thresholds,
      hit: {
        // The algorithm is part of the key: one a config centre switches to starts afresh, and
        // never reads another's state.
        key: ruleStateKey(this.keyPrefix, rule.keyId, identity, thresholds.algorithm),
        conditional: rule.countOn !== 'all',
        algorithm: thresholds.algorithm,
        limit: thresholds.count,
        windowMs: thresholds.windowMs,
        cost,
        burst: thresholds.burst,
        blockMs: rule.blockMs,
      },
    };
  }

  /** The client's address: of the HTTP request (a GraphQL operation's too), or of a WebSocket client. */
  private clientAddress(rule: RateLimitRule, context: ExecutionContext): string {
    const { address, gone } = clientOf(context);
    if (!address) throw this.noClientAddress(rule, gone);
    return clientAddressIdentity(address, this.ipv6PrefixBits);
  }

  private async identify(rule: RateLimitRule, context: ExecutionContext): Promise<string | null> {
    const { by } = rule;
    if (by === 'global') return 'global';
    if (by === 'ip') return this.clientAddress(rule, context);
    const identity: unknown = await by(context);
    if (typeof identity === 'string' && identity !== '') return identity;
    if (typeof identity === 'number' && Number.isFinite(identity)) return String(identity);
    this.warnOnce(
      `identity:${rule.declaredOn}:${rule.name}`,
      `@RateLimit on ${rule.declaredOn}: 'by' returned ${identity === '' ? 'an empty string' : describeValue(identity)} (it runs after the app's guards, so it sees what they set); ` +
        `such requests share one '${ANONYMOUS_IDENTITY}' counter of rule ${rule.name}. To count them apart, fall back to their address (req.user?.id ?? req.ip); to refuse them, throw an HttpException from 'by'`,
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
   * server listening where sockets have none (a Unix socket without `trust proxy`), or a GraphQL
   * context built without its request: said once.
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
}

function describeValue(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  if (value === null || value === undefined || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

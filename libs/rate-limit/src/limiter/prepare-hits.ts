import { HttpException, InternalServerErrorException, Logger } from '@nestjs/common';
import type { IdentityControls, RateLimitConfigCentre, RateLimitOverride } from './rate-limit-config-centre.js';
import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { parseLimitSettings, ruleWithSettings } from '../rules/limit-settings.js';
import { RateLimitConfigurationError, type RateLimitMode, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { ANONYMOUS_IDENTITY, ruleStateKey } from '../store/key-layout.js';
import type { RateLimitHit } from '../store/rate-limit-store.js';
import { clientAddressIdentity } from '../store/key-layout.js';
import type { LimitedRequest } from './limited-request.js';
import type { AllowList } from '../rules/allow-list.js';
import { type ExemptionProblems, skips } from './exemptions.js';
import { describeValue } from '../rules/describe-value.js';

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
  private readonly thresholds: RuleThresholds;
  private readonly warnings = new Warnings();

  constructor(
    configCentre: RateLimitConfigCentre,
    private readonly keyPrefix: string,
    private readonly ipv6PrefixBits: number,
    moduleMode: RateLimitMode,
    private readonly problems: ExemptionProblems,
    /** Per-identity overrides, when the config centre keeps them. */
    private readonly controls: IdentityControls | undefined = undefined,
    private readonly now: () => number = Date.now,
  ) {
    this.thresholds = new RuleThresholds(configCentre, moduleMode);
  }

  /**
   * Whether a request must take `forRequestExempting`: its rule has a `skipIf`, tiers or an allow
   * list in force, or the module allows identities. Nearly every rule has none of them.
   */
  exempting(rule: RateLimitRule, thresholds: Thresholds, moduleList: AllowList | undefined): boolean {
    return (
      rule.skipIf !== undefined ||
      rule.tiers !== undefined ||
      thresholds.allow !== undefined ||
      moduleList?.readsIdentities === true
    );
  }

  /**
   * `forRequest` for a rule that may let the request through or count it under a tier: null when it
   * does not count it (its `skipIf` skips it; its allow list, or the module's for identities, has
   * the request's address, user agent from its networks, or identity).
   * @param known the rule as `forRequest` prepared it already, if it did (while bans are held).
   */
  async forRequestExempting(
    rule: RateLimitRule,
    thresholds: Thresholds,
    request: LimitedRequest,
    moduleList: AllowList | undefined,
    known?: PreparedRule,
  ): Promise<PreparedRule | null> {
    if (rule.skipIf && (await skips(rule.skipIf, request, ruleSubject(rule), this.problems))) {
      return null;
    }
    let counted = rule;
    let inForce = thresholds;
    if (rule.tiers) {
      counted = await this.tierOf(rule, request);
      if (counted !== rule) {
        inForce = this.thresholds.resolve(counted);
        if (inForce.mode === 'off') return null;
      }
    }
    const { allow } = inForce;
    if (allow?.readsRequest && allow.allowsClient(request.address, request.userAgent())) return null;
    const prepared = counted === rule && known ? known : await this.forRequest(counted, inForce, request);
    if (allow?.allowsIdentity(prepared.identity) || moduleList?.allowsIdentity(prepared.identity)) return null;
    return prepared;
  }

  /** The rule of the tier a request is counted under: its `tier` resolver's, else the rule's own. */
  private async tierOf(rule: RateLimitRule, request: LimitedRequest): Promise<RateLimitRule> {
    const name: unknown = await rule.tier!(request.context);
    if (name === undefined || name === null || name === '') return rule;
    const tier = typeof name === 'string' ? rule.tiers!.get(name) : undefined;
    if (tier) return tier;
    this.warnings.once(
      `tier:${rule.declaredOn}:${rule.name}:${String(name).slice(0, 40)}`,
      `@RateLimit on ${rule.declaredOn}: 'tier' returned ${describeValue(name, 40)}, which is not one of its tiers (${[...rule.tiers!.keys()].join(', ')}); such requests get the rule's own count (${rule.count} per ${rule.windowMs} ms)`,
    );
    return rule;
  }

  /**
   * For an HTTP request: identity and cost from the rule's `by` and `cost`. At once (no promise) for
   * `by: 'ip' | 'global'` with a fixed cost, most rules: promises per rule per request add up.
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

  /**
   * @param maxCost a `settleCost` rule's most for this request (its `maxCost`); undefined for other
   *   rules.
   */
  private prepared(
    rule: RateLimitRule,
    given: Thresholds,
    identity: string | null,
    cost: number,
    maxCost = typeof rule.maxCost === 'number' ? rule.maxCost : undefined,
  ): PreparedRule {
    let thresholds = given;
    // An identity's own thresholds, set live for a while (`RateLimitManagementService.setOverride`).
    if (this.controls?.anyOverrides && rule.configKey !== undefined && identity !== null) {
      const values = this.controls.overrideOf(rule.configKey, identity, this.now());
      if (values) thresholds = this.thresholds.forIdentity(rule, values);
    }
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
        overdraftBound: maxCost === undefined ? undefined : Math.max(0, maxCost - cost),
      },
    };
  }

  /** The client's address: of the HTTP request (a GraphQL operation's too), or of a WebSocket client. */
  private clientAddress(rule: RateLimitRule, request: LimitedRequest): string {
    const { address } = request;
    if (!address) throw this.noClientAddress(rule, request.gone());
    return clientAddressIdentity(address, this.ipv6PrefixBits);
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
      'maxCost',
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

/** What a rule counts with for one request. */
export interface Thresholds {
  count: number;
  windowMs: number;
  algorithm: RateLimitAlgorithmName;
  mode: RateLimitMode;
  /** token-bucket and gcra: capacity (the rule's `burst`, else `count`). */
  burst: number;
  /** Requests the rule does not count: its `allow`, or the config centre's. */
  allow: AllowList | undefined;
}

/**
 * A rule's thresholds for this request: the config centre's values where valid, the decorator's
 * otherwise. Values are validated as bootstrap validates decorators, once per object the centre
 * returns (a centre returns the same object while its values stand). An invalid value (or a config
 * centre that throws) is warned about once per key and value, never per request, and the request
 * goes on with the decorator's values.
 */
export class RuleThresholds {
  private readonly warnings = new Warnings();
  /** The decorator's thresholds, with the module's mode where the rule has none. */
  private readonly declared = new WeakMap<RateLimitRule, Thresholds>();
  /** The thresholds last made of a centre's values, by the object that held them. */
  private readonly overridden = new WeakMap<RateLimitRule, { override: RateLimitOverride; thresholds: Thresholds }>();
  /** Per identity's values (`forIdentity`), per rule: the thresholds, and the centre's values they were made over. */
  private readonly perIdentity = new WeakMap<
    RateLimitOverride,
    WeakMap<RateLimitRule, { centre: RateLimitOverride | undefined; thresholds: Thresholds }>
  >();

  constructor(
    private readonly centre: Pick<RateLimitConfigCentre, 'get'>,
    private readonly moduleMode: RateLimitMode,
  ) {}

  /** The decorator's thresholds, with the module's mode where the rule has none. */
  declaredOf(rule: RateLimitRule): Thresholds {
    let declared = this.declared.get(rule);
    if (!declared) this.declared.set(rule, (declared = this.thresholdsOf(rule)));
    return declared;
  }

  resolve(rule: RateLimitRule): Thresholds {
    const declared = this.declaredOf(rule);
    const { configKey } = rule;
    if (configKey === undefined) return declared;
    let override;
    try {
      override = this.centre.get(configKey);
    } catch (error) {
      this.warnings.once(
        `${configKey}#error`,
        `Config centre failed for '${configKey}' (${String(error)}); using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
      return declared;
    }
    if (override === undefined || override === null) return declared;
    const last = this.overridden.get(rule);
    if (last?.override === override) return last.thresholds;
    const thresholds = this.withOverride(rule, override) ?? declared;
    this.overridden.set(rule, { override, thresholds });
    return thresholds;
  }

  /**
   * The thresholds of an identity with values of its own for the rule's key: those values over the
   * centre's for the key, checked as `resolve` checks them (once per values object).
   */
  forIdentity(rule: RateLimitRule, values: RateLimitOverride): Thresholds {
    let byRule = this.perIdentity.get(values);
    if (!byRule) this.perIdentity.set(values, (byRule = new WeakMap()));
    let centre: RateLimitOverride | undefined;
    try {
      centre = this.centre.get(rule.configKey!) ?? undefined;
    } catch {
      centre = undefined; // said by `resolve`, which the request has been through
    }
    const last = byRule.get(rule);
    if (last && last.centre === centre) return last.thresholds;
    const thresholds = this.withOverride(rule, { ...centre, ...values }) ?? this.resolve(rule);
    byRule.set(rule, { centre, thresholds });
    return thresholds;
  }

  /**
   * Field by field: an invalid field means the decorator's value for that field (a bad window from
   * the environment must not undo a count an operator set live); valid fields that no rule of the
   * key could take together (a count below a fixed cost) mean the decorator's values for all.
   */
  private withOverride(rule: RateLimitRule, override: RateLimitOverride): Thresholds | undefined {
    const subject = `Config centre values ${JSON.stringify(override)} of '${rule.configKey}'`;
    const { settings, problems } = parseLimitSettings(override);
    const warn = (problem: string, using: string) =>
      this.warnings.once(`${rule.configKey}#${rule.name}#${JSON.stringify(override)}`, `${problem}; ${using}`);
    let overridden: RateLimitRule;
    try {
      overridden = ruleWithSettings(rule, settings, subject);
    } catch (error) {
      if (!(error instanceof RateLimitConfigurationError)) throw error;
      warn(
        [...problems, ...error.problems].join('; '),
        `using ${describe(rule)} from @RateLimit on ${rule.declaredOn}`,
      );
      return undefined;
    }
    if (problems.length > 0) {
      warn(`${subject}: ${problems.join('; ')}`, `those fields are the decorator's on ${rule.declaredOn}`);
    }
    return this.thresholdsOf(overridden);
  }

  private thresholdsOf(rule: RateLimitRule): Thresholds {
    return {
      count: rule.count,
      windowMs: rule.windowMs,
      algorithm: rule.algorithm,
      mode: rule.mode ?? this.moduleMode,
      burst: rule.burst ?? rule.count,
      allow: rule.allow,
    };
  }
}

/** Says each misconfiguration once, never per request. */
export class Warnings {
  private readonly logger = new Logger('RateLimit');
  private readonly said = new Set<string>();

  once(id: string, message: string): void {
    // Bounded: a config value that keeps changing to new invalid values is a misconfiguration, not
    // an attack, but the set must not grow without end either.
    if (this.said.has(id) || this.said.size >= 1_000) return;
    this.said.add(id);
    this.logger.warn(message);
  }
}

/** How messages name a rule: where it is declared, and its name where that says more. */
function ruleSubject(rule: RateLimitRule): string {
  return rule.name === rule.declaredOn
    ? `@RateLimit on ${rule.declaredOn}`
    : `@RateLimit on ${rule.declaredOn} (rule '${rule.name}')`;
}

function describe(rule: RateLimitRule): string {
  return `count ${rule.count} per ${rule.windowMs} ms`;
}

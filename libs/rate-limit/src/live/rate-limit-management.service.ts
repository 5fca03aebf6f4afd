import { Inject, Injectable, Logger, type OnApplicationBootstrap } from '@nestjs/common';
import { checkLimitValues } from './check-limit-values.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { RedisConfigCentre } from './redis-config-centre.js';
import { parseLimitSettings, settingsAsOverride, throwProblems } from '../rules/limit-settings.js';
import { RuleThresholds, type Thresholds } from '../limiter/rule-thresholds.js';
import { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RateLimitInspection } from '../limiter/rate-limit-inspection.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { RateLimitRuleRef } from '../rules/rate-limit-rule.registry.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitConfigurationError, type RateLimitRule, ruleOptions } from '../rules/rate-limit-rule.js';
import { type CataloguedRule, RuleCatalogue } from './rule-catalogue.js';
import { ChangeLog, type RateLimitChange } from './change-log.js';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitMode } from '../rules/rate-limit-rule.js';
import { EVERY_RULE } from '../limiter/rate-limit-config-centre.js';
import { type TimeOrDuration, parseEndTime } from '../rules/duration.js';
import { type CountingOfEntry, identityAsCounted } from './identity-as-counted.js';
import type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';
import { RateLimitStoreUnavailableError, whyUnavailable } from './store-unavailable-error.js';

/** Who makes a change (`set`, `delete`, `reset`), for the change log: the CLI's user, an admin endpoint's caller. */
export interface RateLimitChangeAuthor {
  /** Default `'unknown'`. */
  by?: string;
}

/**
 * Redis refused a management call for lack of permission (an ACL without a command, a key or a
 * channel the call needs): the message names what Redis refused. Nothing was changed.
 */
export class RateLimitPermissionError extends Error {
  override readonly name = 'RateLimitPermissionError';
}

/** Redis's replies that say the user may not (a command, a key or a channel; in a script, or queued in MULTI). */
const PERMISSION_REFUSED = /\bNOPERM\b|The user executing the script can't/;

/** How many keys with values written `list` looks at beyond those rules read: a few HSCAN calls. */
const LIST_MAX_WRITTEN_KEYS = 100;

/** What a rule counts with. */
export interface RateLimitRuleLimits {
  count: number;
  windowMs: number;
  algorithm: RateLimitAlgorithmName;
  mode: RateLimitMode;
}

/** A config key: the values written for it, and each rule that reads it. */
export interface RateLimitLimitEntry {
  configKey: string;
  /** Written live (`set`), or undefined. */
  written: RateLimitOverride | undefined;
  rules: {
    name: string;
    declaredOn: string;
    /** The decorator's (with the module's mode). */
    declared: RateLimitRuleLimits;
    /** In force on this instance now: the config centre's values where valid, else the decorator's. */
    inForce: RateLimitRuleLimits;
  }[];
}

/**
 * Changing and watching limits while the app runs, for admin endpoints and the
 * `nest-rate-limit-limits` CLI: `set`, `get`, `list` and `delete` the live values of a `configKey`
 * (with `RedisConfigCentre` every instance applies them within milliseconds; with
 * `MemoryConfigCentre` this one), `inspect` an identity's counter under a rule, and `reset` it.
 * Every write is checked exactly as bootstrap checks decorators, against every rule that reads the
 * key (this app's and, with Redis, those the other apps sharing it catalogued), before it is written.
 */
@Injectable()
export class RateLimitManagementService implements OnApplicationBootstrap {
  private readonly logger = new Logger('RateLimit');
  private readonly catalogue: RuleCatalogue | undefined;
  private readonly thresholds: RuleThresholds;
  private readonly changes: ChangeLog;

  /** @internal Nest creates it. */
  constructor(
    private readonly centre: RateLimitConfigCentre,
    private readonly registry: RateLimitRuleRegistry,
    private readonly limiter: RateLimiterService,
    private readonly redis: RedisService,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {
    // Apps whose limits live in Redis catalogue their rules there, for the CLI that changes them.
    if (centre instanceof RedisConfigCentre) this.catalogue = new RuleCatalogue(redis, options.keyPrefix);
    this.thresholds = new RuleThresholds(centre, options.mode);
    // Where the limits are shared, so is the log of their changes.
    this.changes = new ChangeLog(centre instanceof RedisConfigCentre ? redis : undefined, options.keyPrefix);
  }

  async onApplicationBootstrap(): Promise<void> {
    if (!this.catalogue) return;
    await this.publishCatalogue();
    // Redis down at the start, or back empty after a restart: catalogued again once it is back.
    this.redis.connection.whenReady(() => void this.publishCatalogue());
  }

  private async publishCatalogue(): Promise<void> {
    try {
      await this.catalogue?.publish(this.registry.all(), {
        allowListKey: this.options.allow?.configKey,
        ipv6PrefixBits: this.options.ipv6PrefixBits,
      });
    } catch (error) {
      this.logger.warn(
        `Cataloguing the rules in Redis failed (${String(error)}); the CLI knows them once Redis is back`,
      );
    }
  }

  /**
   * Writes values for a config key, over those written before (a field given as `null` or `''` is
   * unset): `set('orders.list', { count: 5000 })`. Throws `RateLimitConfigurationError`, writing
   * nothing, for a key no rule reads or values a rule of the key would refuse.
   */
  async set(
    configKey: string,
    values: RateLimitOverride,
    author?: RateLimitChangeAuthor,
  ): Promise<RateLimitLimitEntry> {
    return this.permitted('set', () => this.write(configKey, values, author));
  }

  private async write(
    configKey: string,
    values: RateLimitOverride,
    author: RateLimitChangeAuthor | undefined,
  ): Promise<RateLimitLimitEntry> {
    const centre = this.live('set');
    const rules = await this.rulesReading(configKey);
    // A Map, not an object: a field named `__proto__` stays a field (and is refused as one),
    // instead of becoming the prototype whose fields the check would then read as given.
    const merged = new Map(Object.entries((await this.read(centre, [configKey])).get(configKey) ?? {}));
    for (const [field, value] of Object.entries(values ?? {})) {
      if (value === null || value === '') merged.delete(field);
      else if (value !== undefined) merged.set(field, value);
    }
    const given = Object.fromEntries(merged);
    if (rules.length === 0) {
      // The module's allow list: what the key holds is read as nothing else.
      const others = [...merged.keys()].filter((field) => field !== 'allow');
      throwProblems(
        `RateLimitManagementService.set`,
        others.map(
          (field) =>
            `config key '${configKey}' holds the module's allow list: '${field}' is not a setting of it (only 'allow')`,
        ),
      );
    }
    throwProblems(`RateLimitManagementService.set`, checkLimitValues(configKey, given, rules));
    const written = settingsAsOverride(parseLimitSettings(given).settings);
    await this.record(author, { change: 'set', configKey, values: { ...written } });
    await centre.write(configKey, written);
    // What was written, and what this instance holds now: no second read of Redis.
    return this.entry(configKey, rules, new Map([[configKey, written]]));
  }

  /** A config key's written values and rules. Throws for a key no rule reads. */
  async get(configKey: string): Promise<RateLimitLimitEntry> {
    return this.entry(configKey, await this.rulesReading(configKey));
  }

  /**
   * Every config key that rules read (this app's, and those catalogued), in order; and of the keys
   * with values that no rule reads (left over from renamed rules, say), those among the first
   * `LIST_MAX_WRITTEN_KEYS` found: listing costs what the rules do, not what the hash holds.
   */
  async list(): Promise<RateLimitLimitEntry[]> {
    const rules = await this.knownRules();
    const read = new Set(rules.flatMap((rule) => rule.configKey ?? []));
    const others = this.centre instanceof LiveConfigCentre ? await this.writtenKeys(this.centre) : [];
    const keys = [...new Set([...read, ...others])].sort();
    const written = await this.written(keys);
    return Promise.all(
      keys.map((configKey) =>
        this.entry(
          configKey,
          rules.filter((rule) => rule.configKey === configKey),
          written,
        ),
      ),
    );
  }

  /** Deletes a config key's written values: its rules fall back to the base centre's, then the decorator's. */
  async delete(configKey: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const centre = this.live('delete');
    return this.permitted('delete', async () => {
      await this.record(author, { change: 'delete', configKey });
      return centre.remove(configKey);
    });
  }

  /** An identity's counter under a rule (by name), read without counting anything. */
  async inspect(ruleName: string, identity: string): Promise<RateLimitInspection> {
    return this.limiter.inspect(await this.ruleNamed(ruleName), identity);
  }

  /** Forgets an identity's counts and penalty under rules (by name), on every instance. */
  async reset(ruleNames: string | readonly string[], identity: string, author?: RateLimitChangeAuthor): Promise<void> {
    const names = typeof ruleNames === 'string' ? [ruleNames] : ruleNames;
    const rules = await Promise.all(names.map((name) => this.ruleNamed(name)));
    await this.permitted('reset', async () => {
      await this.record(author, { change: 'reset', rules: [...names], identity });
      await this.limiter.reset(rules, identity);
    });
  }

  /**
   * Refuses an identity on every instance until `until`, without a store call per request: under one
   * rule (by name), or under every rule, `'*'` (the client address too, for an address). `until`: a
   * `Date`, an ISO 8601 time, ms since the epoch, or a duration from now with its unit (`'1h'`); at
   * most 365 days away: every ban ends. An address given for a rule counted by client address (for
   * `'*'`, any address) is taken as the rule counts it: IPv4-mapped as IPv4, IPv6 per
   * `ipv6PrefixBits` prefix (that of the app that catalogued the rule, from the CLI).
   */
  async ban(rule: string, identity: string, until: Date | string | number, author?: RateLimitChangeAuthor) {
    const entries = this.live('ban').identities;
    const ruleName = await this.ruleOrEvery(rule, 'ban');
    const counted = identityAsCounted(identity, 'ban', await this.countingOfBan(ruleName));
    const ends = this.endOf(until, 'ban');
    await this.permitted('ban', async () => {
      await this.record(author, {
        change: 'ban',
        rules: [ruleName],
        identity: counted,
        until: new Date(ends).toISOString(),
      });
      await entries.ban(ruleName, counted, ends);
    });
    return { rule: ruleName, identity: counted, until: new Date(ends).toISOString() };
  }

  /** Lifts a ban on every instance (an address taken as `ban` takes it); false when there was none. */
  async unban(rule: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = this.live('unban').identities;
    const ruleName = await this.ruleOrEvery(rule, 'unban');
    const counted = identityAsCounted(identity, 'unban', { ...(await this.countingOfBan(ruleName)), lenient: true });
    return this.permitted('unban', async () => {
      await this.record(author, { change: 'unban', rules: [ruleName], identity: counted });
      // A ban written with the address as given (by an earlier version) goes too.
      return (await entries.unban(ruleName, counted)) || (counted !== identity && entries.unban(ruleName, identity));
    });
  }

  /** The bans in force. */
  bans(): Promise<RateLimitBan[]> {
    return this.permitted('bans', () => this.live('bans').identities.listBans(), '');
  }

  /**
   * Gives one identity its own `count` and `window` under a config key's rules until `until` (as
   * `ban` takes it): `setOverride('orders', 'acme', { count: 20000 }, '2026-12-31T23:59Z')`. Checked
   * as any limit is, against every rule of the key; on every instance within a second, and gone by
   * itself when it ends. An address given for rules counted by client address is taken as they
   * count it (as `ban` does). Refused on the module's allow-list key, which has no thresholds, and
   * on the key of a rule with `tiers`, whose requests count under their tier's key
   * (`<configKey>.<tier>`): the override goes there.
   */
  async setOverride(
    configKey: string,
    identity: string,
    values: RateLimitOverride,
    until: Date | string | number,
    author?: RateLimitChangeAuthor,
  ): Promise<RateLimitIdentityOverride> {
    const entries = this.live('setOverride').identities;
    const known = await this.knownRules();
    const rules = await this.rulesReading(configKey, known);
    const subject = `RateLimitManagementService.setOverride`;
    throwProblems(subject, overrideKeyProblems(configKey, rules, known));
    const counted = identityAsCounted(identity, 'setOverride', this.countingOfOverride(configKey, rules));
    const given = Object.fromEntries(Object.entries(values ?? {}).filter(([, value]) => value !== undefined));
    const others = Object.keys(given).filter((field) => field !== 'count' && field !== 'window');
    throwProblems(
      subject,
      others.map((field) => `'${field}' cannot be set per identity (only count and window)`),
    );
    if (Object.keys(given).length === 0) throwProblems(subject, ["give 'count', 'window' or both"]);
    throwProblems(subject, checkLimitValues(configKey, given, rules));
    const written = settingsAsOverride(parseLimitSettings(given).settings);
    const ends = this.endOf(until, 'setOverride');
    const entry = { configKey, identity: counted, values: written, until: new Date(ends).toISOString() };
    await this.permitted('setOverride', async () => {
      await this.record(author, {
        change: 'set-override',
        configKey,
        identity: counted,
        values: { ...written },
        until: entry.until,
      });
      await entries.setOverride(configKey, counted, written, ends);
    });
    return entry;
  }

  /**
   * Ends an identity's override (an address taken as `setOverride` takes it) before its time; false
   * when there was none.
   */
  async deleteOverride(configKey: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = this.live('deleteOverride').identities;
    // The rules reading the key now: none (a key renamed since) takes the identity as given.
    const rules = (await this.knownRules()).filter((rule) => rule.configKey === configKey);
    const counted = identityAsCounted(identity, 'deleteOverride', {
      ...this.countingOfOverride(configKey, rules),
      lenient: true,
    });
    return this.permitted('deleteOverride', async () => {
      await this.record(author, { change: 'delete-override', configKey, identity: counted });
      // An override written with the address as given (by an earlier version) goes too.
      return (
        (await entries.deleteOverride(configKey, counted)) ||
        (counted !== identity && entries.deleteOverride(configKey, identity))
      );
    });
  }

  /** The per-identity overrides in force. */
  overrides(): Promise<RateLimitIdentityOverride[]> {
    return this.permitted('overrides', () => this.live('overrides').identities.listOverrides(), '');
  }

  /** A rule's name, or `'*'`; throws for a name no rule has. */
  private async ruleOrEvery(rule: string, method: string): Promise<string> {
    if (rule === EVERY_RULE) return rule;
    if (typeof rule !== 'string' || rule === '') {
      throw new RateLimitConfigurationError(
        `RateLimitManagementService.${method}: 'rule' must be a rule's name or '*'`,
      );
    }
    await this.ruleNamed(rule);
    return rule;
  }

  /**
   * How a ban under `rule` is matched: as an address in the rule's app where it counts by address;
   * for `'*'`, which every app matches against the client address, in every app whose rules are
   * known (this process's own without any).
   */
  private async countingOfBan(rule: string): Promise<CountingOfEntry> {
    const known = await this.knownRules();
    if (rule !== EVERY_RULE) {
      return { ...this.countingOf(known.filter((each) => each.name === rule)), subject: `rule "${rule}"` };
    }
    return {
      prefixBits: known.length === 0 ? [this.options.ipv6PrefixBits] : known.map((each) => this.prefixBitsOf(each)),
      addressesOnly: known.length > 0 && known.every((each) => each.by === 'ip'),
      subject: 'every rule',
      networks: true,
    };
  }

  private countingOfOverride(configKey: string, rules: readonly KnownRule[]): CountingOfEntry {
    return { ...this.countingOf(rules), subject: `every rule of config key '${configKey}'`, networks: false };
  }

  /** The `ipv6PrefixBits` of the apps of those rules that count by client address, and whether all do. */
  private countingOf(rules: readonly KnownRule[]): Omit<CountingOfEntry, 'subject'> {
    const byAddress = rules.filter((rule) => rule.by === 'ip');
    return {
      prefixBits: byAddress.map((rule) => this.prefixBitsOf(rule)),
      addressesOnly: byAddress.length > 0 && byAddress.length === rules.length,
      networks: true,
    };
  }

  /** An own rule counts with this module's prefix; a catalogued one with its app's, where catalogued. */
  private prefixBitsOf(rule: KnownRule): number {
    return rule.ipv6PrefixBits ?? this.options.ipv6PrefixBits;
  }

  /** When an entry given `until` ends, in ms on the module's clock; throws unless in the next 365 days. */
  private endOf(until: TimeOrDuration, method: string): number {
    const ends = parseEndTime(until, this.options.clock?.() ?? Date.now());
    if ('problem' in ends) {
      throw new RateLimitConfigurationError(
        `RateLimitManagementService.${method}: 'until' ${ends.problem}, got ${JSON.stringify(until)}`,
      );
    }
    return ends.at;
  }

  /**
   * The latest changes made through this service (on any instance, and the CLI, where the limits
   * are in Redis), newest first: what, by whom, when. At most 1,000 are kept.
   */
  async changeLog(count = 50): Promise<RateLimitChange[]> {
    const latest = Math.min(1_000, Math.max(1, Math.floor(count) || 1));
    return this.permitted('changeLog', () => this.changes.latest(latest), '');
  }

  /**
   * Logs a change before it is made: a change Redis will not log (no permission) is not made, and
   * every change made carries who made it.
   */
  private async record(author: RateLimitChangeAuthor | undefined, change: Omit<RateLimitChange, 'at' | 'by'>) {
    const by = author?.by || 'unknown';
    await this.permitted(
      change.change,
      () => this.changes.record({ at: new Date().toISOString(), by, ...change }),
      ' nothing was changed.',
    );
    this.logger.log(`Live change by ${JSON.stringify(by)}: ${JSON.stringify(change)}`);
  }

  /**
   * Runs a call, a refusal by Redis for lack of permission turned into a `RateLimitPermissionError`
   * naming it, and a Redis full or not answering into a `RateLimitStoreUnavailableError`, each
   * saying what became of the change (`outcome`): refused past the change log, a change may be made
   * in part (a value written but not announced, counters deleted but the news of it refused).
   */
  private async permitted<T>(
    method: string,
    call: () => Promise<T>,
    outcome = ' the change may be made in part: check it with get or inspect.',
  ): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (error instanceof RateLimitPermissionError || error instanceof RateLimitStoreUnavailableError) throw error;
      const message = error instanceof Error ? error.message : String(error);
      const unavailable = whyUnavailable(error);
      if (unavailable) {
        throw new RateLimitStoreUnavailableError(`RateLimitManagementService.${method}: ${unavailable};${outcome}`, {
          cause: error,
        });
      }
      if (!PERMISSION_REFUSED.test(message)) throw error;
      throw new RateLimitPermissionError(
        `RateLimitManagementService.${method}: Redis refused it for lack of permission (${message});${outcome} ` +
          'The Redis user needs the ACL in the docs (operations.md, "A least-privilege Redis user")',
      );
    }
  }

  private live(method: string): LiveConfigCentre {
    if (this.centre instanceof LiveConfigCentre) return this.centre;
    throw new RateLimitConfigurationError(
      `RateLimitManagementService.${method}: the config centre (${this.centre.constructor.name}) cannot be written while the app runs; use RedisConfigCentre (or MemoryConfigCentre for one instance) as 'configCentre'`,
    );
  }

  /**
   * This app's rules, and those other apps catalogued under names this app has none of (while
   * Redis is away, this app's alone).
   */
  private async knownRules(): Promise<KnownRule[]> {
    const own = this.registry.all();
    if (!this.catalogue) return own;
    const names = new Set(own.map((rule) => rule.name));
    // While Redis is away, an app knows its own rules; a process with none (the CLI) says why it knows none.
    const catalogued = await this.catalogue.rules().catch((error: unknown) => {
      if (own.length === 0) throw error;
      return [];
    });
    return [...own, ...catalogued.filter((rule) => !names.has(rule.name))];
  }

  /** The values written for these keys, from their source; while it is away, as this instance holds them. */
  private async written(configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    if (!(this.centre instanceof LiveConfigCentre)) return new Map();
    return this.read(this.centre, configKeys);
  }

  private read(centre: LiveConfigCentre, configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    return centre.read(configKeys).catch((error: unknown) => {
      // A source that cannot be used as it is (a key of another type in place of the hash) says so.
      if (error instanceof RateLimitConfigurationError) throw error;
      return centre.held();
    });
  }

  private writtenKeys(centre: LiveConfigCentre): Promise<string[]> {
    return centre.writtenKeys(LIST_MAX_WRITTEN_KEYS).catch((error: unknown) => {
      if (error instanceof RateLimitConfigurationError) throw error;
      return [...centre.held().keys()];
    });
  }

  private async rulesReading(configKey: string, known?: readonly KnownRule[]): Promise<KnownRule[]> {
    if (typeof configKey !== 'string' || configKey.trim() === '') {
      throw new RateLimitConfigurationError(`RateLimitManagementService: 'configKey' must be a non-empty string`);
    }
    known ??= await this.knownRules();
    const rules = known.filter((rule) => rule.configKey === configKey);
    if (rules.length === 0 && (await this.allowListKeys()).includes(configKey)) return rules;
    if (rules.length === 0) {
      const keys = [...new Set(known.flatMap((rule) => rule.configKey ?? []))].sort();
      throw new RateLimitConfigurationError(
        `RateLimitManagementService: no rule reads config key ${JSON.stringify(configKey)} (config keys: ${JSON.stringify(keys)})`,
      );
    }
    return rules;
  }

  /** The config keys of module-wide allow lists: this app's, and those catalogued. */
  private async allowListKeys(): Promise<string[]> {
    const own = this.options.allow?.configKey;
    const catalogued = (await this.catalogue?.allowListKeys().catch(() => [])) ?? [];
    return own === undefined ? catalogued : [own, ...catalogued];
  }

  private async ruleNamed(name: string): Promise<RateLimitRuleRef> {
    const known = await this.knownRules();
    const rules = known.filter((rule) => rule.name === name);
    if (rules.length === 0) {
      const names = [...new Set(known.map((rule) => rule.name))].sort();
      throw new RateLimitConfigurationError(
        `RateLimitManagementService: no rule is named ${JSON.stringify(name)} (rules: ${JSON.stringify(names)})`,
      );
    }
    // The registry's own rule where there is one: it says when two routes count a name differently.
    if (this.registry.all().some((rule) => rule.name === name)) return name;
    return { ...ruleOptions(rules[0]), name };
  }

  private async entry(
    configKey: string,
    rules: readonly RateLimitRule[],
    written?: Map<string, RateLimitOverride>,
  ): Promise<RateLimitLimitEntry> {
    const values = (written ?? (await this.written([configKey]))).get(configKey);
    const own = new Set(this.registry.all());
    // Another app's rule (catalogued) is in force on its instances as the values written make it;
    // this instance neither holds nor serves them.
    const asWritten = new RuleThresholds({ get: (key) => (key === configKey ? values : undefined) }, this.options.mode);
    return {
      configKey,
      written: values,
      rules: rules.map((rule) => ({
        name: rule.name,
        declaredOn: rule.declaredOn,
        declared: limitsOf(this.thresholds.declaredOf(rule)),
        // As the limiter reckons them for a request: the same checks, the same fallback.
        inForce: limitsOf((own.has(rule) ? this.thresholds : asWritten).resolve(rule)),
      })),
    };
  }
}

/** A rule this app declares, or one another app catalogued (with that app's `ipv6PrefixBits`). */
type KnownRule = RateLimitRule & Pick<CataloguedRule, 'ipv6PrefixBits'>;

/**
 * Why a config key takes no per-identity override: the module's allow list has no thresholds (no
 * rule reads it), and a rule with `tiers` counts its requests under their tier's key, where an
 * override of its own key would never be read for them.
 */
function overrideKeyProblems(configKey: string, rules: readonly KnownRule[], known: readonly KnownRule[]): string[] {
  if (rules.length === 0) {
    return [
      `config key '${configKey}' holds the module's allow list, which has no count or window to override; give a rule's config key`,
    ];
  }
  return rules.flatMap((rule) => {
    if (rule.tierName !== undefined) return [];
    const tierKeys = known
      .filter((tier) => tier.name === rule.name && tier.tierName !== undefined)
      .flatMap((tier) => tier.configKey ?? []);
    if (tierKeys.length === 0) return [];
    return [
      `config key '${configKey}': rule ${JSON.stringify(rule.name)} counts by tier, each tier under its own key (${tierKeys.map((key) => `'${key}'`).join(', ')}); set the override on the key of the identity's tier`,
    ];
  });
}

function limitsOf({ count, windowMs, algorithm, mode }: Thresholds): RateLimitRuleLimits {
  return { count, windowMs, algorithm, mode };
}

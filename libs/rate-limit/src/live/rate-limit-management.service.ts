import { Inject, Injectable, Logger, type OnApplicationBootstrap } from '@nestjs/common';
import { checkLimitValues } from './check-limit-values.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { RedisConfigCentre } from './redis-config-centre.js';
import { parseLimitSettings, settingsAsOverride, throwProblems } from '../rules/limit-settings.js';
import { RuleThresholds, type Thresholds } from '../limiter/prepare-hits.js';
import { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RateLimitInspection } from '../limiter/rate-limit-inspection.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { RateLimitRuleRef } from '../rules/rate-limit-rule.registry.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitConfigurationError, type RateLimitRule, ruleOptions } from '../rules/rate-limit-rule.js';
import { RuleCatalogue } from './rule-catalogue.js';
import { ChangeLog, type RateLimitChange } from './change-log.js';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { RateLimitMode } from '../rules/rate-limit-rule.js';
import { isIP } from 'node:net';
import { EVERY_RULE } from '../limiter/rate-limit-config-centre.js';
import { MAX_DURATION_MS, parseDuration } from '../rules/duration.js';
import { clientAddressIdentity } from '../transports/limited-context.js';
import type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';

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
    this.redis.whenReady(() => void this.publishCatalogue());
  }

  private async publishCatalogue(): Promise<void> {
    try {
      await this.catalogue?.publish(this.registry.all(), this.options.allow?.configKey);
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
   * `Date`, an ISO 8601 time, or a duration from now (`'1h'`); at most 365 days: every ban ends.
   * An identity of a rule counted by client address is the address as that rule counts it.
   */
  async ban(rule: string, identity: string, until: Date | string | number, author?: RateLimitChangeAuthor) {
    const entries = this.live('ban').identities;
    const ruleName = await this.ruleOrEvery(rule, 'ban');
    const counted = this.identityAsCounted(ruleName, identity, 'ban');
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

  /** Lifts a ban on every instance; false when there was none. */
  async unban(rule: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = this.live('unban').identities;
    const ruleName = await this.ruleOrEvery(rule, 'unban');
    const counted = this.identityAsCounted(ruleName, identity, 'unban');
    return this.permitted('unban', async () => {
      await this.record(author, { change: 'unban', rules: [ruleName], identity: counted });
      return entries.unban(ruleName, counted);
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
   * itself when it ends.
   */
  async setOverride(
    configKey: string,
    identity: string,
    values: RateLimitOverride,
    until: Date | string | number,
    author?: RateLimitChangeAuthor,
  ): Promise<RateLimitIdentityOverride> {
    const entries = this.live('setOverride').identities;
    const rules = await this.rulesReading(configKey);
    checkIdentityGiven(identity, 'setOverride');
    const subject = `RateLimitManagementService.setOverride`;
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
    const entry = { configKey, identity, values: written, until: new Date(ends).toISOString() };
    await this.permitted('setOverride', async () => {
      await this.record(author, {
        change: 'set-override',
        configKey,
        identity,
        values: { ...written },
        until: entry.until,
      });
      await entries.setOverride(configKey, identity, written, ends);
    });
    return entry;
  }

  /** Ends an identity's override before its time; false when there was none. */
  async deleteOverride(configKey: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = this.live('deleteOverride').identities;
    checkIdentityGiven(identity, 'deleteOverride');
    return this.permitted('deleteOverride', async () => {
      await this.record(author, { change: 'delete-override', configKey, identity });
      return entries.deleteOverride(configKey, identity);
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

  /** The identity as the rule counts it: an address in the form a `by: 'ip'` rule keys it (IPv6 per prefix). */
  private identityAsCounted(rule: string, identity: string, method: string): string {
    checkIdentityGiven(identity, method);
    const byAddress =
      isIP(identity) !== 0 &&
      (rule === EVERY_RULE || this.registry.all().some((each) => each.name === rule && each.by === 'ip'));
    return byAddress ? clientAddressIdentity(identity, this.options.ipv6PrefixBits) : identity;
  }

  /** When an entry given `until` ends, in ms on the module's clock; throws unless in the next 365 days. */
  private endOf(until: Date | string | number, method: string): number {
    const now = this.options.clock?.() ?? Date.now();
    let ends: number | undefined;
    if (until instanceof Date) ends = until.getTime();
    else if (
      typeof until === 'number' ||
      (typeof until === 'string' && /^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)?\s*$/.test(until))
    ) {
      const ms = parseDuration(until);
      ends = ms === undefined ? undefined : now + ms;
    } else if (typeof until === 'string') ends = Date.parse(until);
    if (ends === undefined || !Number.isFinite(ends) || ends <= now || ends - now > MAX_DURATION_MS) {
      throw new RateLimitConfigurationError(
        `RateLimitManagementService.${method}: 'until' must be a time in the next 365 days (a Date, an ISO 8601 time such as '2026-12-31T23:59Z') or a duration from now ('1h', '7d'), got ${JSON.stringify(until)}`,
      );
    }
    return ends;
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
   * naming it, and saying what became of the change (`outcome`): refused past the change log, a
   * change may be made in part (a value written but not announced, counters deleted but the news
   * of it refused).
   */
  private async permitted<T>(
    method: string,
    call: () => Promise<T>,
    outcome = ' the change may be made in part: check it with get or inspect.',
  ): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (error instanceof RateLimitPermissionError) throw error;
      const message = error instanceof Error ? error.message : String(error);
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
  private async knownRules(): Promise<RateLimitRule[]> {
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

  private async rulesReading(configKey: string): Promise<RateLimitRule[]> {
    if (typeof configKey !== 'string' || configKey.trim() === '') {
      throw new RateLimitConfigurationError(`RateLimitManagementService: 'configKey' must be a non-empty string`);
    }
    const known = await this.knownRules();
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

function limitsOf({ count, windowMs, algorithm, mode }: Thresholds): RateLimitRuleLimits {
  return { count, windowMs, algorithm, mode };
}

function checkIdentityGiven(identity: unknown, method: string): void {
  if (typeof identity !== 'string' || identity === '' || identity.length > 512) {
    throw new RateLimitConfigurationError(
      `RateLimitManagementService.${method}: 'identity' must be a non-empty string of at most 512 characters`,
    );
  }
}

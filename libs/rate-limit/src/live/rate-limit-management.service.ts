import { Inject, Injectable, type OnApplicationBootstrap } from '@nestjs/common';
import { RedisConfigCentre } from './redis-config-centre.js';
import { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RateLimitInspection } from '../limiter/rate-limit-inspection.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { AuthoredChanges, type RateLimitChangeAuthor } from './authored-changes.js';
import { ChangeLog, type RateLimitChange } from './change-log.js';
import type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';
import { IdentityEntryManagement } from './identity-entry-management.js';
import { KnownRules } from './known-rules.js';
import { LimitManagement, type RateLimitLimitEntry } from './limit-management.js';
import { permitted } from './management-refusals.js';

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
  private readonly rules: KnownRules;
  private readonly changes: AuthoredChanges;
  private readonly limits: LimitManagement;
  private readonly identities: IdentityEntryManagement;

  /** @internal Nest creates it. */
  constructor(
    centre: RateLimitConfigCentre,
    registry: RateLimitRuleRegistry,
    private readonly limiter: RateLimiterService,
    private readonly redis: RedisService,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) options: ResolvedRateLimitOptions,
  ) {
    // Apps whose limits live in Redis catalogue their rules there, for the CLI that changes them;
    // where the limits are shared, so is the log of their changes.
    const shared = centre instanceof RedisConfigCentre ? redis : undefined;
    this.rules = new KnownRules(registry, shared, options);
    this.changes = new AuthoredChanges(new ChangeLog(shared, options.keyPrefix));
    this.limits = new LimitManagement(centre, this.rules, this.changes, options.mode);
    this.identities = new IdentityEntryManagement(centre, this.rules, this.changes, options);
  }

  async onApplicationBootstrap(): Promise<void> {
    if (!this.rules.catalogued) return;
    await this.rules.publish();
    // Redis down at the start, or back empty after a restart: catalogued again once it is back.
    this.redis.connection.whenReady(() => void this.rules.publish());
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
    return this.limits.set(configKey, values, author);
  }

  /** A config key's written values and rules. Throws for a key no rule reads. */
  async get(configKey: string): Promise<RateLimitLimitEntry> {
    return this.limits.get(configKey);
  }

  /**
   * Every config key that rules read (this app's, and those catalogued), in order; and of the keys
   * with values that no rule reads (left over from renamed rules, say), those among the first
   * `LIST_MAX_WRITTEN_KEYS` found: listing costs what the rules do, not what the hash holds.
   */
  async list(): Promise<RateLimitLimitEntry[]> {
    return this.limits.list();
  }

  /** Deletes a config key's written values: its rules fall back to the base centre's, then the decorator's. */
  async delete(configKey: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    return this.limits.delete(configKey, author);
  }

  /** An identity's counter under a rule (by name), read without counting anything. */
  async inspect(ruleName: string, identity: string): Promise<RateLimitInspection> {
    return this.limiter.inspect(await this.rules.named(ruleName), identity);
  }

  /** Forgets an identity's counts and penalty under rules (by name), on every instance. */
  async reset(ruleNames: string | readonly string[], identity: string, author?: RateLimitChangeAuthor): Promise<void> {
    const names = typeof ruleNames === 'string' ? [ruleNames] : ruleNames;
    const rules = await Promise.all(names.map((name) => this.rules.named(name)));
    await permitted('reset', async () => {
      await this.changes.record(author, { change: 'reset', rules: [...names], identity });
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
    return this.identities.ban(rule, identity, until, author);
  }

  /** Lifts a ban on every instance (an address taken as `ban` takes it); false when there was none. */
  async unban(rule: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    return this.identities.unban(rule, identity, author);
  }

  /** The bans in force. */
  bans(): Promise<RateLimitBan[]> {
    return this.identities.bans();
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
    return this.identities.setOverride(configKey, identity, values, until, author);
  }

  /**
   * Ends an identity's override (an address taken as `setOverride` takes it) before its time; false
   * when there was none.
   */
  async deleteOverride(configKey: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    return this.identities.deleteOverride(configKey, identity, author);
  }

  /** The per-identity overrides in force. */
  overrides(): Promise<RateLimitIdentityOverride[]> {
    return this.identities.overrides();
  }

  /**
   * The latest changes made through this service (on any instance, and the CLI, where the limits
   * are in Redis), newest first: what, by whom, when. At most 1,000 are kept.
   */
  async changeLog(count = 50): Promise<RateLimitChange[]> {
    return this.changes.latest(count);
  }
}

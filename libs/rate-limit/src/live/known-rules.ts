import { Logger } from '@nestjs/common';
import { EVERY_RULE } from '../limiter/rate-limit-config-centre.js';
import type { ResolvedRateLimitOptions } from '../module/options.js';
import type { RedisService } from '../redis/redis.service.js';
import { RateLimitConfigurationError, type RateLimitRule, ruleOptions } from '../rules/rate-limit-rule.js';
import type { RateLimitRuleRef, RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { type CataloguedRule, RuleCatalogue } from './rule-catalogue.js';

/** A rule this app declares, or one another app catalogued (with that app's `ipv6PrefixBits`). */
export type KnownRule = RateLimitRule & Pick<CataloguedRule, 'ipv6PrefixBits'>;

/**
 * The rules a management call is checked against and names: this app's, and where the limits are in
 * Redis, those the apps sharing it catalogued (`RuleCatalogue`), which this app catalogues its own
 * among. So the CLI, without the app's controllers, checks a write against every rule that reads the
 * key. Throws for a config key no rule reads and a name no rule has, naming those there are.
 */
export class KnownRules {
  private readonly logger = new Logger('RateLimit');
  private readonly catalogue: RuleCatalogue | undefined;

  /** @param redis where the limits live in Redis, to catalogue the rules there; none: this app's alone. */
  constructor(
    private readonly registry: RateLimitRuleRegistry,
    redis: RedisService | undefined,
    private readonly options: Pick<ResolvedRateLimitOptions, 'keyPrefix' | 'allow' | 'ipv6PrefixBits'>,
  ) {
    if (redis) this.catalogue = new RuleCatalogue(redis, options.keyPrefix);
  }

  /** Whether the rules are catalogued in Redis. */
  get catalogued(): boolean {
    return this.catalogue !== undefined;
  }

  /** Catalogues this app's rules; a failure is logged, and the next call (once Redis is back) mends it. */
  async publish(): Promise<void> {
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

  /** This app's own rules. */
  own(): readonly RateLimitRule[] {
    return this.registry.all();
  }

  /**
   * This app's rules, and those other apps catalogued under names this app has none of (while
   * Redis is away, this app's alone).
   */
  async all(): Promise<KnownRule[]> {
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

  /**
   * The rules that read a config key (none for the key of a module's allow list); throws for a key
   * no rule reads. `known`: the rules known, where the caller has them already.
   */
  async reading(configKey: string, known?: readonly KnownRule[]): Promise<KnownRule[]> {
    if (typeof configKey !== 'string' || configKey.trim() === '') {
      throw new RateLimitConfigurationError(`RateLimitManagementService: 'configKey' must be a non-empty string`);
    }
    known ??= await this.all();
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

  /** A rule by name, as the limiter takes it; throws for a name no rule has. */
  async named(name: string): Promise<RateLimitRuleRef> {
    const known = await this.all();
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

  /** A rule's name, or `'*'`, for a call (`method`); throws for a name no rule has. */
  async nameOrEvery(rule: string, method: string): Promise<string> {
    if (rule === EVERY_RULE) return rule;
    if (typeof rule !== 'string' || rule === '') {
      throw new RateLimitConfigurationError(
        `RateLimitManagementService.${method}: 'rule' must be a rule's name or '*'`,
      );
    }
    await this.named(rule);
    return rule;
  }

  /** The config keys of module-wide allow lists: this app's, and those catalogued. */
  private async allowListKeys(): Promise<string[]> {
    const own = this.options.allow?.configKey;
    const catalogued = (await this.catalogue?.allowListKeys().catch(() => [])) ?? [];
    return own === undefined ? catalogued : [own, ...catalogued];
  }
}

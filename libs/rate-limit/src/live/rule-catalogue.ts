import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { type RateLimitOptions, type RateLimitRule, ruleOptions, validateRule } from '../rules/rate-limit-rule.js';

/** How long the catalogue outlives the last instance that wrote it: a deploy renames rules, the old names fade. */
const CATALOGUE_TTL_MS = 30 * 24 * 3_600_000;

/** A rule as the catalogue holds it: its options, with functions named by what they are. */
type CataloguedRule = Omit<RateLimitOptions, 'by' | 'cost'> & {
  declaredOn: string;
  by: 'ip' | 'global' | 'function';
  cost: number | 'function';
};

/**
 * The rules of the apps that share a Redis, in a hash beside the live limits (`<prefix>:config:rules`,
 * rule name to its options), written by each instance at its start. So a process without the app's
 * controllers (the `nest-rate-limit-limits` CLI) checks written limits against the rules that read
 * them, and inspects counters by rule name.
 */
export class RuleCatalogue {
  private readonly key: string;

  constructor(
    private readonly redis: RedisService,
    keyPrefix: string,
  ) {
    this.key = liveConfigKeys(keyPrefix).rules;
  }

  /**
   * @param rules the app's rules, tiers included: a tier is catalogued as `name@tier`, with its own
   *   thresholds and config key.
   * @param allowListKey the module's `allow.configKey`, whose values only an allow list may be.
   */
  async publish(rules: readonly RateLimitRule[], allowListKey?: string): Promise<void> {
    if (rules.length === 0 && allowListKey === undefined) return;
    const fields = rules.flatMap((rule) => [fieldOf(rule), JSON.stringify(catalogued(rule))]);
    if (allowListKey !== undefined) fields.push(`${ALLOW_LIST_FIELD}${allowListKey}`, '{}');
    await this.redis.operation(
      this.redis.client
        .multi()
        .hset(this.key, ...fields)
        .pexpire(this.key, CATALOGUE_TTL_MS)
        .exec(),
      'MULTI',
    );
  }

  /** Every rule catalogued, validated again (one that no longer validates is left out). */
  async rules(): Promise<RateLimitRule[]> {
    const stored = await this.redis.operation(this.redis.client.hgetall(this.key), 'HGETALL');
    const rules: RateLimitRule[] = [];
    for (const [field, text] of Object.entries(stored)) {
      if (field.startsWith(ALLOW_LIST_FIELD)) continue;
      // A tier: the rule's name, before its tier.
      const name = field.split('@')[0];
      try {
        const { declaredOn, by, cost, ...options } = JSON.parse(text) as CataloguedRule;
        rules.push(
          validateRule(
            { ...options, name, by: by === 'function' ? identityAsGiven : by, cost: cost === 'function' ? 1 : cost },
            declaredOn,
            name,
          ),
        );
      } catch {
        // Written by another version, or by hand: not a rule this process can use.
      }
    }
    return rules;
  }

  /** The config keys of the module-wide allow lists of the apps catalogued. */
  async allowListKeys(): Promise<string[]> {
    const fields = await this.redis.operation(this.redis.client.hkeys(this.key), 'HKEYS');
    return fields
      .filter((field) => field.startsWith(ALLOW_LIST_FIELD))
      .map((field) => field.slice(ALLOW_LIST_FIELD.length));
  }
}

/** Starts the field of an allow list's config key; no rule name starts so. */
const ALLOW_LIST_FIELD = '~allow:';

function fieldOf(rule: RateLimitRule): string {
  return rule.tierName === undefined ? rule.name : `${rule.name}@${rule.tierName}`;
}

function catalogued(rule: RateLimitRule): CataloguedRule {
  // What the CLI checks values against: the thresholds; not what the app runs per request.
  const { by, cost, skipIf: _skipIf, allow: _allow, ...options } = ruleOptions(rule);
  return {
    ...options,
    declaredOn: rule.declaredOn,
    by: typeof by === 'function' ? 'function' : (by ?? 'ip'),
    cost: typeof cost === 'function' ? 'function' : (cost ?? 1),
  };
}

/** The `by` of a catalogued rule whose identity a function computes: outside the app, the identity is given. */
function identityAsGiven(): string {
  throw new Error('A catalogued rule has no HTTP identity');
}

import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { type RateLimitOptions, type RateLimitRule, ruleOptions, validateRule } from '../rules/rate-limit-rule.js';

/** How long the catalogue outlives the last instance that wrote it: a deploy renames rules, the old names fade. */
const CATALOGUE_TTL_MS = 30 * 24 * 3_600_000;

/**
 * A rule as the catalogue holds it: its options, with functions named by what they are, and the
 * `ipv6PrefixBits` of its app, so a process without the app (the CLI) takes an address given for
 * it (a ban, an override) as the app counts it.
 */
type StoredRule = Omit<RateLimitOptions, 'by' | 'cost'> & {
  declaredOn: string;
  by: 'ip' | 'global' | 'function';
  cost: number | 'function';
  /** Left out by versions before it: the reading process's own then. */
  ipv6PrefixBits?: number;
};

/** A rule read from the catalogue: with the `ipv6PrefixBits` of the app that catalogued it, when known. */
export type CataloguedRule = RateLimitRule & { readonly ipv6PrefixBits?: number };

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
   * @param module of the app's module options: `allow.configKey` (the key whose values only an allow
   *   list may be) and `ipv6PrefixBits` (how its rules count an IPv6 client).
   */
  async publish(
    rules: readonly RateLimitRule[],
    { allowListKey, ipv6PrefixBits }: { allowListKey?: string; ipv6PrefixBits: number },
  ): Promise<void> {
    if (rules.length === 0 && allowListKey === undefined) return;
    const fields = rules.flatMap((rule) => [fieldOf(rule), JSON.stringify(stored(rule, ipv6PrefixBits))]);
    if (allowListKey !== undefined) fields.push(`${ALLOW_LIST_FIELD}${allowListKey}`, '{}');
    await this.redis.runner.operation(
      (client) =>
        client
          .multi()
          .hset(this.key, ...fields)
          .pexpire(this.key, CATALOGUE_TTL_MS)
          .exec(),
      'MULTI',
    );
  }

  /**
   * Every rule catalogued, validated again (one that no longer validates is left out); a tier with
   * its `tierName`, as the app's registry holds it.
   */
  async rules(): Promise<CataloguedRule[]> {
    const fields = await this.redis.runner.operation((client) => client.hgetall(this.key), 'HGETALL');
    const rules: CataloguedRule[] = [];
    for (const [field, text] of Object.entries(fields)) {
      if (field.startsWith(ALLOW_LIST_FIELD)) continue;
      // A tier: the rule's name, before its tier.
      const [name, tierName] = field.split('@');
      try {
        const { declaredOn, by, cost, ipv6PrefixBits, ...options } = JSON.parse(text) as StoredRule;
        const rule = validateRule(
          { ...options, name, by: by === 'function' ? identityAsGiven : by, cost: cost === 'function' ? 1 : cost },
          declaredOn,
          name,
        );
        rules.push({
          ...rule,
          ...(tierName === undefined ? {} : { tierName }),
          ...(isPrefixBits(ipv6PrefixBits) ? { ipv6PrefixBits } : {}),
        });
      } catch {
        // Written by another version, or by hand: not a rule this process can use.
      }
    }
    return rules;
  }

  /** The config keys of the module-wide allow lists of the apps catalogued. */
  async allowListKeys(): Promise<string[]> {
    const fields = await this.redis.runner.operation((client) => client.hkeys(this.key), 'HKEYS');
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

function stored(rule: RateLimitRule, ipv6PrefixBits: number): StoredRule {
  // What the CLI checks values against: the thresholds; not what the app runs per request.
  const { by, cost, skipIf: _skipIf, allow: _allow, settleCost: _settleCost, ...options } = ruleOptions(rule);
  return {
    ...options,
    declaredOn: rule.declaredOn,
    by: typeof by === 'function' ? 'function' : (by ?? 'ip'),
    cost: typeof cost === 'function' ? 'function' : (cost ?? 1),
    ipv6PrefixBits,
  };
}

function isPrefixBits(value: unknown): value is number {
  return Number.isInteger(value) && (value as number) >= 1 && (value as number) <= 128;
}

/** The `by` of a catalogued rule whose identity a function computes: outside the app, the identity is given. */
function identityAsGiven(): string {
  throw new Error('A catalogued rule has no HTTP identity');
}

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

  async publish(rules: readonly RateLimitRule[]): Promise<void> {
    if (rules.length === 0) return;
    const fields = rules.flatMap((rule) => [rule.name, JSON.stringify(catalogued(rule))]);
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
    for (const [name, text] of Object.entries(stored)) {
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
}

function catalogued(rule: RateLimitRule): CataloguedRule {
  const { by, cost, ...options } = ruleOptions(rule);
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

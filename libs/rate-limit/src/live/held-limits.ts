import type { RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { SampledLogger } from '../logging/sampled-logger.js';
import type { RateLimitRule } from '../rules/rate-limit-rule.js';
import { checkLimitValues } from './check-limit-values.js';

/**
 * The live limits one instance holds, by config key, and what becomes of each text read from Redis:
 * parsed and checked as bootstrap checks decorators, against the rules of its key, and in force if
 * good; an invalid one refused with a sampled warning naming the key and the value, while the key's
 * last good values stay. Apart from `RedisConfigCentre`, which decides what is read and when, so the
 * rule for taking a stored value in is written once, for every way a value arrives.
 */
export class HeldLimits {
  /** Values in force, by key: each a frozen object, replaced when its key's value changes. */
  private readonly values = new Map<string, RateLimitOverride>();
  /** The text last read per key, good or refused: unchanged text is not checked again. */
  private readonly texts = new Map<string, string>();
  private refusedCount = 0;

  /**
   * @param refusals where refused values are said, sampled.
   * @param rulesOf the rules of this app that read a config key's values.
   */
  constructor(
    private readonly refusals: SampledLogger,
    private readonly rulesOf: (configKey: string) => readonly RateLimitRule[],
  ) {}

  /** A key's values in force, if any. */
  get(configKey: string): RateLimitOverride | undefined {
    return this.values.get(configKey);
  }

  /** Keys with values in force. */
  get size(): number {
    return this.values.size;
  }

  /** Values refused as invalid since the start. */
  get refused(): number {
    return this.refusedCount;
  }

  /** The values in force, as a copy. */
  copy(): Map<string, RateLimitOverride> {
    return new Map(this.values);
  }

  /** The text last read for a key, good or refused: to tell whether a newer one arrived since. */
  textOf(configKey: string): string | undefined {
    return this.texts.get(configKey);
  }

  /** A key's text as read from Redis (null: none): checked, and in force if good. */
  arrive(configKey: string, text: string | null): void {
    if (text === null) {
      this.texts.delete(configKey);
      this.values.delete(configKey);
      return;
    }
    if (this.texts.get(configKey) === text) return;
    this.texts.set(configKey, text);
    const { values, problems } = this.checked(configKey, text);
    if (!values) {
      this.refusedCount += 1;
      const kept = this.values.get(configKey);
      this.refusals.record(
        configKey,
        `Refused limits ${text.length > 200 ? `${text.slice(0, 200)}…` : text} for config key '${configKey}' (${problems.join('; ')}); ${kept ? `its last good values ${JSON.stringify(kept)} stay` : "its rules' decorator values stay"}`,
      );
      return;
    }
    this.values.set(configKey, values);
  }

  /** A key's text as values, checked with the rules of the key this app has (frozen), or the problems found. */
  checked(configKey: string, text: string): { values?: RateLimitOverride; problems: string[] } {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
    const problems = checkLimitValues(configKey, parsed, this.rulesOf(configKey));
    if (problems.length > 0) return { problems };
    return { values: Object.freeze({ ...(parsed as RateLimitOverride) }), problems };
  }
}

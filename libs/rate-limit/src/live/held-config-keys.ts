import type { Logger } from '@nestjs/common';
import type { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';

/**
 * Config keys held beyond those of the app's rules: keys first asked for by `get` (rules given to
 * `RateLimiterService.consume` as options). Code declares them, so they are few; the bound keeps a
 * caller that makes keys of its input from growing what every re-read asks Redis for.
 */
const MAX_ASKED_KEYS = 1_000;

/**
 * The config keys an instance holds the live values of and reads from Redis (`RedisConfigCentre`):
 * those its rules read, the module's allow list, and those first asked for by `get`, up to
 * `MAX_ASKED_KEYS` of them. What an instance asks Redis for is bounded by these, not by the hash.
 */
export class HeldConfigKeys {
  private readonly keys = new Set<string>();
  private asked = 0;
  private saidTooManyAsked = false;

  constructor(
    private readonly registry: RateLimitRuleRegistry,
    private readonly allowListKey: string | undefined,
    private readonly logger: Logger,
  ) {}

  has(configKey: string): boolean {
    return this.keys.has(configKey);
  }

  /** Every key held, the rules' among them. */
  all(): string[] {
    // The rules' keys: the registry has them from the modules' init, before Redis is first ready.
    for (const rule of this.registry.all()) if (rule.configKey !== undefined) this.keys.add(rule.configKey);
    if (this.allowListKey !== undefined) this.keys.add(this.allowListKey);
    return [...this.keys];
  }

  /**
   * Holds a key first asked for by `get` from now on: true, to be read at once; false past
   * `MAX_ASKED_KEYS` (said once), the key keeping its rules' values.
   */
  ask(configKey: string): boolean {
    if (this.asked >= MAX_ASKED_KEYS) {
      if (!this.saidTooManyAsked) {
        this.saidTooManyAsked = true;
        this.logger.warn(
          `More than ${MAX_ASKED_KEYS} config keys asked for beyond the rules'; '${configKey}' and later ones keep their rules' values (are config keys made of input?)`,
        );
      }
      return false;
    }
    this.asked += 1;
    this.keys.add(configKey);
    return true;
  }
}

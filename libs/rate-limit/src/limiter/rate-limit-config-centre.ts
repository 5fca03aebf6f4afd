import type { StepEntry } from './limiter-step.js';
import type { RateLimitOverride } from './limit-values.js';

export type { RateLimitOverride } from './limit-values.js';

/**
 * Where thresholds live at run time. Asked on every request for rules with a `configKey`, so it
 * must answer from memory; a provider backed by a remote store keeps a local snapshot that its
 * watch/subscription updates. A changed value applies from the next request, without a restart.
 * Return the same object while a key's values are unchanged: the rule is validated with them once
 * per object, not per request.
 *
 * Supply your own with `RateLimitModule.forRoot({ configCentre: MyConfigCentre })`; the package has
 * `NestConfigCentre` (the default), `RedisConfigCentre` and `MemoryConfigCentre` (both live, and
 * writable through `RateLimitManagementService`).
 *
 * @example
 * ```ts
 * @Injectable()
 * export class FeatureFlagConfigCentre extends RateLimitConfigCentre {
 *   constructor(private readonly flags: FlagsClient) { super(); }
 *   get(configKey: string) { return this.flags.snapshot()[`ratelimit.${configKey}`]; }
 * }
 * ```
 */
export abstract class RateLimitConfigCentre {
  abstract get(configKey: string): RateLimitOverride | undefined;

  /**
   * The limiter's steps this centre brings: a live one's bans and per-identity overrides. Default none.
   * @internal
   */
  limiterSteps(): readonly StepEntry[] {
    return [];
  }
}

/** Rule name of a ban on every rule. */
export const EVERY_RULE = '*';

/**
 * What an operator set for single identities while the app runs (`RateLimitManagementService.ban`,
 * `setOverride`), as the limiter reads it per request: from memory, never from the store. A live
 * config centre keeps it, and its steps read it (`BansStep`, `OverridesStep`); the others have none.
 */
export interface IdentityControls {
  /** Whether any ban is held: without one, no request is looked up. */
  readonly anyBans: boolean;
  /** When a ban of this identity under this rule (or `'*'`) ends, in ms; undefined: none in force. */
  banUntil(rule: string, identity: string, now: number): number | undefined;
  /** Whether any override is held. */
  readonly anyOverrides: boolean;
  /**
   * The values in force for this identity under a config key's rules (the same object while they
   * stand), or undefined.
   */
  overrideOf(configKey: string, identity: string, now: number): RateLimitOverride | undefined;
}

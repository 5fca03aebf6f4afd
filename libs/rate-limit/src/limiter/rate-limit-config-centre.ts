import type { IdentityControls } from './identity-controls.js';

/**
 * Run-time values for the rules of one `configKey`. Values may be numbers or strings (as env files
 * and remote config stores carry them); they are validated on use, and an invalid one is ignored.
 */
export interface RateLimitOverride {
  /** Units per window: a positive whole number. */
  count?: unknown;
  /** A window: ms, or a duration such as `'1m'`. */
  window?: unknown;
  /** An algorithm name; a rule whose other options do not suit it (a `lease`, a `burst`) keeps its own. */
  algorithm?: unknown;
  /** `'enforce'`, `'shadow'` or `'off'`. */
  mode?: unknown;
  /**
   * Requests the rules of the key do not count, replacing their `allow` (`{}`: none):
   * `{ addresses, identities, userAgents }`, as an object or its JSON. For the module's
   * `allow.configKey`, the module-wide list.
   */
  allow?: unknown;
}

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
   * Bans and per-identity overrides, for a centre that holds them (the live ones); default none.
   * @internal
   */
  identityControls(): IdentityControls | undefined {
    return undefined;
  }
}

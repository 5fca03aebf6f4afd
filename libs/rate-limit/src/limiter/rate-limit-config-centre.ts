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
   * `{ addresses, identities, userAgents }` (each user agent with its networks, `{ agent, from }`), as
   * an object or its JSON. For the module's `allow.configKey`, the module-wide list.
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

/** Rule name of a ban on every rule. */
export const EVERY_RULE = '*';

/**
 * What an operator set for single identities while the app runs (`RateLimitManagementService.ban`,
 * `setOverride`), as the limiter reads it per request: from memory, never from the store. A live
 * config centre keeps it (`LiveConfigCentre.identityControls`); the others have none, and the
 * limiter then asks nothing.
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

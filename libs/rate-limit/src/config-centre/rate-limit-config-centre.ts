/**
 * Run-time overrides for a rule's threshold. Values may be numbers or strings (as env files and
 * remote config stores carry them); they are validated on use, and an invalid one is ignored.
 */
export interface RateLimitOverride {
  count?: unknown;
  window?: unknown;
}

/**
 * Where thresholds live at run time. Asked on every request for rules with a `configKey`, so it
 * must answer from memory; a provider backed by a remote store keeps a local snapshot that its
 * watch/subscription updates. A changed value applies from the next request, without a restart.
 *
 * Supply your own with `RateLimitModule.forRoot({ configCentre: MyConfigCentre })`.
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
}

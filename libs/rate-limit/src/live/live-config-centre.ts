import type { StepEntry } from '../limiter/limiter-step.js';
import { RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { IdentityEntries } from './identity-entries.js';
import { BansStep } from './steps/bans.step.js';
import { OverridesStep } from './steps/overrides.step.js';

/**
 * A config centre whose values can be written while the app runs (`RateLimitManagementService`,
 * the `nest-rate-limit-limits` CLI), over an optional base centre: a key's written values win field
 * by field over the base's (`ConfigService`'s, say), which win over the decorator's. Written values
 * are kept in memory, so `get` never waits; a deleted key falls back to the base, then the decorator.
 */
export abstract class LiveConfigCentre extends RateLimitConfigCentre {
  /** Per key: the base's and the written values last merged, and the merge, returned while both stand. */
  private readonly merged = new Map<
    string,
    { base: RateLimitOverride | undefined; written: RateLimitOverride; both: RateLimitOverride }
  >();

  /**
   * @param identities the bans and per-identity overrides this centre keeps (written through
   *   `RateLimitManagementService`), where the limits are.
   * @internal
   */
  constructor(
    private readonly base: RateLimitConfigCentre | undefined,
    /** @internal */
    readonly identities: IdentityEntries,
  ) {
    super();
  }

  /** @internal */
  override limiterSteps(): readonly StepEntry[] {
    return [
      { make: (kit) => new BansStep(this.identities, kit) },
      { uses: (rule) => rule.configKey !== undefined, make: (kit) => new OverridesStep(this.identities, kit) },
    ];
  }

  get(configKey: string): RateLimitOverride | undefined {
    const written = this.current(configKey);
    const base = this.base?.get(configKey);
    if (!written || !base) return written ?? base;
    const last = this.merged.get(configKey);
    if (last && last.base === base && last.written === written) return last.both;
    const both = { ...base, ...withoutUnset(written) };
    this.merged.set(configKey, { base, written, both });
    return both;
  }

  /** The values written for a key as this instance holds them now (validated), or undefined. */
  protected abstract current(configKey: string): RateLimitOverride | undefined;

  /**
   * The values written for these keys, as the source of truth holds them now (each validated; an
   * invalid one left out), whichever rules read them: for `RateLimitManagementService`.
   */
  abstract read(configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>>;

  /**
   * Up to `max` of the keys with values written, whichever rules read them (or none): what listing
   * them costs is bounded by `max`, not by what the source holds.
   */
  abstract writtenKeys(max: number): Promise<string[]>;

  /** The values this instance holds (what it serves, and while its source is away, still serves). */
  abstract held(): Map<string, RateLimitOverride>;

  /** Writes a key's values (already validated), for every instance; this one holds them at once. */
  abstract write(configKey: string, values: RateLimitOverride): Promise<void>;

  /** Deletes a key's values, for every instance; false when there were none. */
  abstract remove(configKey: string): Promise<boolean>;
}

function withoutUnset(values: RateLimitOverride): RateLimitOverride {
  // Defined, not assigned: a field named `__proto__` stays a field.
  return Object.fromEntries(
    Object.entries(values).filter(([, value]) => value !== undefined && value !== null && value !== ''),
  );
}

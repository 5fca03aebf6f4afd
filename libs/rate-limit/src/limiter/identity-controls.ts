import type { RateLimitOverride } from './rate-limit-config-centre.js';

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

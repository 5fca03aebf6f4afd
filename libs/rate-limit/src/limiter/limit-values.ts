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

/** Where `@RateLimit` and `@SkipRateLimit` keep their metadata: internal, not part of the public API. */
export const RATE_LIMIT_RULES = 'rate-limit:rules';
export const RATE_LIMIT_SKIP = 'rate-limit:skip';

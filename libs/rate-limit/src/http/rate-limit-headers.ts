import type { RateLimitOutcome, RuleDecision } from '../limiter/rate-limit-outcome.js';
import { retryAfterSeconds } from '../limiter/rate-limit-outcome.js';
import { remainingAfter } from '../store/rate-limit-store.js';

/**
 * Which rate-limit headers responses carry:
 * - `'draft-6'` (default): `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of the
 *   tightest rule, as draft-ietf-httpapi-ratelimit-headers-06 and earlier name them, and as most
 *   clients read them today;
 * - `'draft-11'`: the current draft's structured fields, one item per rule, named after it:
 *   `RateLimit-Policy: "orders";q=100;w=60, "user";q=5;w=1` and
 *   `RateLimit: "orders";r=97;t=42, "user";r=4;t=1`;
 * - `'x-ratelimit'`: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the
 *   tightest rule, the names `@nestjs/throttler` sends, for clients migrating from it;
 * - `false`: none.
 * Whatever the style, a rejected request carries `Retry-After`.
 */
export type RateLimitHeaderStyle = 'draft-6' | 'draft-11' | 'x-ratelimit' | false;
export const HEADER_STYLES: readonly RateLimitHeaderStyle[] = ['draft-6', 'draft-11', 'x-ratelimit', false];

/** The names of the styles that report the tightest rule: limit, remaining, reset. */
const TIGHTEST_RULE_NAMES = {
  'draft-6': ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'],
  'x-ratelimit': ['X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset'],
} as const;

/**
 * The headers of a request the store decided, in `style`, as names and values in turn (one array
 * per response, not one per header); a rejection's `Retry-After` last.
 */
export function rateLimitHeaders(outcome: RateLimitOutcome, style: RateLimitHeaderStyle): string[] {
  const reported = outcome.reported!;
  let headers: string[];
  if (style === 'draft-6' || style === 'x-ratelimit') {
    const [limit, remaining, reset] = TIGHTEST_RULE_NAMES[style];
    headers = [
      limit,
      String(reported.limit),
      remaining,
      String(reported.remaining),
      reset,
      String(resetSeconds(reported)),
    ];
  } else if (style === 'draft-11') {
    // Rule names are letters, digits and `. _ $ -`: valid sf-strings as they are.
    const decided = outcome.decisions.filter((decision) => !decision.fallback && decision.mode !== 'shadow');
    headers = [
      'RateLimit-Policy',
      decided.map((d) => `"${d.rule.name}";q=${d.limit};w=${Math.ceil(d.windowMs / 1000)}`).join(', '),
      'RateLimit',
      decided
        .map((d) => `"${d.rule.name}";r=${remainingAfter(d, outcome.allowed, d.cost)};t=${resetSeconds(d)}`)
        .join(', '),
    ];
  } else {
    headers = [];
  }
  if (!outcome.allowed) headers.push('Retry-After', String(retryAfterSeconds(reported)));
  return headers;
}

/** Seconds until the full limit is available again, rounded up. */
function resetSeconds(decision: RuleDecision): number {
  return Math.max(0, Math.ceil(decision.resetMs / 1000));
}

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

/** The headers of a request the store decided, in `style`; a rejection's `Retry-After` last. */
export function rateLimitHeaders(outcome: RateLimitOutcome, style: RateLimitHeaderStyle): [string, string][] {
  const reported = outcome.reported!;
  const headers: [string, string][] = [];
  if (style === 'draft-6' || style === 'x-ratelimit') {
    const prefix = style === 'draft-6' ? 'RateLimit' : 'X-RateLimit';
    headers.push(
      [`${prefix}-Limit`, String(reported.limit)],
      [`${prefix}-Remaining`, String(reported.remaining)],
      [`${prefix}-Reset`, String(resetSeconds(reported))],
    );
  } else if (style === 'draft-11') {
    // Rule names are letters, digits and `. _ $ -`: valid sf-strings as they are.
    const decided = outcome.decisions.filter((decision) => !decision.fallback && decision.mode !== 'shadow');
    headers.push(
      [
        'RateLimit-Policy',
        decided.map((d) => `"${d.rule.name}";q=${d.limit};w=${Math.ceil(d.windowMs / 1000)}`).join(', '),
      ],
      [
        'RateLimit',
        decided
          .map((d) => `"${d.rule.name}";r=${remainingAfter(d, outcome.allowed, d.cost)};t=${resetSeconds(d)}`)
          .join(', '),
      ],
    );
  }
  if (!outcome.allowed) headers.push(['Retry-After', String(retryAfterSeconds(reported))]);
  return headers;
}

/** Seconds until the full limit is available again, rounded up. */
function resetSeconds(decision: RuleDecision): number {
  return Math.max(0, Math.ceil(decision.resetMs / 1000));
}

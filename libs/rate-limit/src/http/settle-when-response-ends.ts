import type { ServerResponse } from 'node:http';
import type { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { RateLimitOutcome } from '../limiter/rate-limit-outcome.js';

/**
 * Refunds `countOn` units once the response ends, however it ends: a later guard that refuses
 * the request, a handler that throws, a timeout, a broken stream, a client that goes away.
 */
export function settleWhenResponseEnds(
  outcome: RateLimitOutcome,
  response: object,
  limiter: Pick<RateLimiterService, 'settle'>,
): void {
  // Express hands us the Node response; Fastify a reply wrapping it as `raw`.
  const raw = ((response as { raw?: ServerResponse }).raw ?? response) as ServerResponse;
  let settled = false;
  const settle = (succeeded: boolean) => {
    if (settled) return;
    settled = true;
    void limiter.settle(outcome, succeeded);
  };
  // The client may have gone while the request waited for admissions in flight: then neither
  // event comes again, and the admission must still end.
  if (raw.destroyed || raw.socket?.destroyed) {
    settle(false);
    return;
  }
  raw.once('finish', () => settle(raw.statusCode < 400));
  // Closed before it finished: the client went away or the response stream failed.
  raw.once('close', () => settle(false));
}

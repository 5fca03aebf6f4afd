import { HttpException, HttpStatus } from '@nestjs/common';

/** The 429 body. */
export interface RateLimitExceptionBody {
  statusCode: 429;
  error: 'Too Many Requests';
  message: string;
  /** Seconds until a request can be admitted again (the `Retry-After` header's value). */
  retryAfter: number;
}

/**
 * Thrown by `RateLimitGuard` when a rule rejects a request: HTTP 429, a JSON body with `retryAfter`
 * (seconds), and the `Retry-After` and `RateLimit-*` headers already set on the response. Catch it
 * with an exception filter to change the body; the headers stay.
 */
export class RateLimitException extends HttpException {
  constructor(
    readonly retryAfterSeconds: number,
    /** Name of the rule that rejected the request. */
    readonly ruleName: string,
    message = rejectionMessage(ruleName, retryAfterSeconds),
  ) {
    const body: RateLimitExceptionBody = {
      statusCode: HttpStatus.TOO_MANY_REQUESTS,
      error: 'Too Many Requests',
      message,
      retryAfter: retryAfterSeconds,
    };
    super(body, HttpStatus.TOO_MANY_REQUESTS);
  }
}

/** What every rejection says, over HTTP, GraphQL and WebSocket alike. */
export function rejectionMessage(rule: string, retryAfterSeconds: number): string {
  return `Too many requests (rate limit '${rule}'); retry in ${retryAfterSeconds} s`;
}

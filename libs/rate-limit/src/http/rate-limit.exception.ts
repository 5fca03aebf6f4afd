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

/** The JSON body of a `RateLimitBannedException`. */
export interface RateLimitBannedExceptionBody {
  statusCode: 403 | 429;
  error: 'Forbidden' | 'Too Many Requests';
  message: string;
  /** Seconds until the ban ends (the `Retry-After` header's value). */
  retryAfter: number;
}

/**
 * The 403 (or, with `bans: { status: 429 }`, the 429) of a banned identity: `Retry-After` says when
 * the ban ends.
 */
export class RateLimitBannedException extends HttpException {
  constructor(
    readonly retryAfterSeconds: number,
    /** The rule the ban is on (`'*'`: every rule), or the rule of the request it refused. */
    readonly ruleName: string,
    status: 403 | 429 = HttpStatus.FORBIDDEN,
  ) {
    const body: RateLimitBannedExceptionBody = {
      statusCode: status,
      error: status === HttpStatus.FORBIDDEN ? 'Forbidden' : 'Too Many Requests',
      message: banMessage(ruleName, retryAfterSeconds),
      retryAfter: retryAfterSeconds,
    };
    super(body, status);
  }
}

/** What a refusal by a ban says: of a ban on every rule (`'*'`), no rule's name. */
export function banMessage(rule: string, retryAfterSeconds: number): string {
  if (rule === '*') return `Refused: banned; retry in ${retryAfterSeconds} s`;
  return `Refused: banned (rate limit '${rule}'); retry in ${retryAfterSeconds} s`;
}

/** What every rejection says, over HTTP, GraphQL and WebSocket alike. */
export function rejectionMessage(rule: string, retryAfterSeconds: number): string {
  return `Too many requests (rate limit '${rule}'); retry in ${retryAfterSeconds} s`;
}

/**
 * A refusal is an answer, not a fault: its error is made without a stack trace, which nobody
 * reads and which cost about 7 µs of every 429 (`npm run bench:http`, under attack).
 */
export function withoutStack<T>(create: () => T): T {
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return create();
  } finally {
    Error.stackTraceLimit = limit;
  }
}

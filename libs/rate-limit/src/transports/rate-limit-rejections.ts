import { IntrinsicException } from '@nestjs/common';

/** What a rejected GraphQL operation's error carries in `extensions`. */
export interface RateLimitGraphQLExtensions {
  code: 'RATE_LIMITED';
  /** Seconds until the operation can be admitted again. */
  retryAfter: number;
  /** The rule that rejected it. */
  rule: string;
}

/**
 * Thrown by `RateLimitGuard` when a rule rejects a GraphQL operation. It is no `HttpException`, so
 * the Apollo driver does not turn it into an `INTERNAL_SERVER_ERROR` with status 429; GraphQL puts
 * its `extensions` on the error the client receives: `{ code: 'RATE_LIMITED', retryAfter, rule }`.
 * An `IntrinsicException`, so Nest does not log it: rejections are logged by sampling only.
 */
export class RateLimitGraphQLError extends IntrinsicException {
  override readonly name = 'RateLimitGraphQLError';
  readonly extensions: RateLimitGraphQLExtensions;

  constructor(
    retryAfter: number,
    rule: string,
    message = `Too many requests (rate limit '${rule}'); retry in ${retryAfter} s`,
  ) {
    super(message);
    this.extensions = { code: 'RATE_LIMITED', retryAfter, rule };
  }
}

/** What a rejected WebSocket message's `exception` event carries. */
export interface RateLimitWsError {
  status: 'error';
  message: string;
  /** Seconds until a message can be admitted again. */
  retryAfter: number;
  rule: string;
}

let wsException: (new (error: object) => Error) | undefined;

/**
 * A `WsException` (so Nest's gateway filter emits its body to the client as an `exception` event)
 * whose body is a `RateLimitWsError`. `@nestjs/websockets` is loaded on the first rejection: a
 * gateway exists only where it is installed.
 */
export async function wsRejection(retryAfter: number, rule: string): Promise<Error> {
  wsException ??= (await import('@nestjs/websockets')).WsException as new (error: object) => Error;
  const body: RateLimitWsError = {
    status: 'error',
    message: `Too many requests (rate limit '${rule}'); retry in ${retryAfter} s`,
    retryAfter,
    rule,
  };
  // Made without a stack trace, as every refusal is: an answer, not a fault.
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 0;
  try {
    return new wsException(body);
  } finally {
    Error.stackTraceLimit = limit;
  }
}

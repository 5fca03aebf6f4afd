import { IntrinsicException } from '@nestjs/common';
import { rejectionMessage } from '../http/rate-limit.exception.js';

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

  constructor(retryAfter: number, rule: string, message = rejectionMessage(rule, retryAfter)) {
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

let wsRejection: ((retryAfter: number, rule: string) => Error) | undefined;

/**
 * Makes the error of a rejected WebSocket message: a `WsException` (so Nest's gateway filter emits
 * its body to the client as an `exception` event) whose body is a `RateLimitWsError`.
 * `@nestjs/websockets` is loaded on the first rejection: a gateway exists only where it is installed.
 */
export async function loadWsRejection(): Promise<(retryAfter: number, rule: string) => Error> {
  if (!wsRejection) {
    const { WsException } = await import('@nestjs/websockets');
    wsRejection = (retryAfter, rule) => {
      const body: RateLimitWsError = {
        status: 'error',
        message: rejectionMessage(rule, retryAfter),
        retryAfter,
        rule,
      };
      return new WsException(body);
    };
  }
  return wsRejection;
}

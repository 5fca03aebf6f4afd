import { IntrinsicException } from '@nestjs/common';
import { rejectionMessage } from '../http/rate-limit.exception.js';

/**
 * Thrown by `RateLimitGuard` when a rule rejects a GraphQL operation. It is no `HttpException`, so
 * the Apollo driver does not turn it into an `INTERNAL_SERVER_ERROR` with status 429; GraphQL puts
 * its `extensions` on the error the client receives: `{ code: 'RATE_LIMITED', retryAfter, rule }`.
 * An `IntrinsicException`, so Nest does not log it: rejections are logged by sampling only.
 */
export class RateLimitGraphQLError extends IntrinsicException {
  override readonly name = 'RateLimitGraphQLError';
  /** What the error carries to the client. */
  readonly extensions: {
    code: 'RATE_LIMITED';
    /** Seconds until the operation can be admitted again. */
    retryAfter: number;
    /** The rule that rejected it. */
    rule: string;
  };

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
  /** The refused message's pattern (its `@SubscribeMessage` event), for a client with several in flight. */
  pattern: string;
  /** The refused message's own `id`, when its data carried one (a string or a number). */
  id?: string | number;
}

/** The message a WebSocket rejection is about: its pattern, and the data it carried. */
export interface RefusedWsMessage {
  pattern: string;
  data: unknown;
}

type WsRejection = (retryAfter: number, rule: string, refused: RefusedWsMessage) => Error;
let wsRejection: WsRejection | undefined;

/**
 * Makes the error of a rejected WebSocket message: a `WsException` (so Nest's gateway filter emits
 * its body to the client as an `exception` event) whose body is a `RateLimitWsError`.
 * `@nestjs/websockets` is loaded on the first rejection: a gateway exists only where it is installed.
 */
export async function loadWsRejection(): Promise<WsRejection> {
  if (!wsRejection) {
    const { WsException } = await import('@nestjs/websockets');
    wsRejection = (retryAfter, rule, { pattern, data }) => {
      const body: RateLimitWsError = {
        status: 'error',
        message: rejectionMessage(rule, retryAfter),
        retryAfter,
        rule,
        pattern,
      };
      const id = (data as { id?: unknown } | null | undefined)?.id;
      if (typeof id === 'string' || (typeof id === 'number' && Number.isFinite(id))) body.id = id;
      return new WsException(body);
    };
  }
  return wsRejection;
}

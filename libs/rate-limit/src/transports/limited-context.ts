import type { ExecutionContext } from '@nestjs/common';

/**
 * The transports the guard limits, and what a rule reads of each: the request an HTTP route or a
 * GraphQL operation runs for (its client address, whether its client has gone), or the client of a
 * WebSocket message. Read by shape, so `@nestjs/graphql` and `@nestjs/websockets` stay optional.
 */
export type LimitedTransport = 'http' | 'graphql' | 'ws';

/** Where the address of the client lives on what the transport gives. */
interface Addressed {
  ip?: string;
  socket?: { remoteAddress?: string; destroyed?: boolean };
  /** Fastify's request, inside a GraphQL context. */
  raw?: { socket?: { remoteAddress?: string; destroyed?: boolean } };
}

/** A WebSocket client: socket.io's (`handshake`, `conn`) or `ws`'s (`_socket`). */
interface WsClient {
  handshake?: { address?: string };
  connected?: boolean;
  _socket?: { remoteAddress?: string; destroyed?: boolean };
  readyState?: number;
}

export function transportOf(context: ExecutionContext): LimitedTransport | undefined {
  const type = context.getType<string>();
  return type === 'http' || type === 'graphql' || type === 'ws' ? type : undefined;
}

/**
 * The HTTP request behind a context: the request itself, or the one a GraphQL operation runs for
 * (its context's `req`, as the Express drivers name it, or `request`, as Fastify's do). Undefined
 * for a WebSocket message, or a GraphQL context without one (a subscription over WebSocket).
 */
export function httpRequestOf(context: ExecutionContext): object | undefined {
  const transport = context.getType<string>();
  if (transport === 'http') return context.switchToHttp().getRequest<object>();
  if (transport !== 'graphql') return undefined;
  const gql = context.getArgByIndex<{ req?: object; request?: object; reply?: { request?: object } } | undefined>(2);
  // Mercurius's context holds the reply, which holds the request.
  return gql?.req ?? gql?.request ?? gql?.reply?.request;
}

/** The client's address, and whether it has gone (its connection closed before the decision). */
export function clientOf(context: ExecutionContext): { address: string | undefined; gone: boolean } {
  if (context.getType<string>() === 'ws') {
    const client = context.switchToWs().getClient<WsClient>();
    const address = client.handshake?.address ?? client._socket?.remoteAddress;
    const gone = client.connected === false || client._socket?.destroyed === true || (client.readyState ?? 1) > 1;
    return { address, gone };
  }
  const request = httpRequestOf(context) as Addressed | undefined;
  // A GraphQL context without a request was built without one (a misconfiguration, said once),
  // not a client gone; an HTTP request without a socket has lost its connection.
  if (!request) return { address: undefined, gone: false };
  const socket = request.socket ?? request.raw?.socket;
  return { address: request.ip ?? socket?.remoteAddress, gone: socket ? socket.destroyed === true : true };
}

/**
 * What one guard invocation is known by, so a guard registered twice (globally and with
 * `@UseGuards`) decides once: the HTTP request; for a GraphQL field or a WebSocket message, the
 * arguments array Nest hands every guard of that one call.
 */
export function invocationOf(context: ExecutionContext): object {
  return context.getType<string>() === 'http' ? context.switchToHttp().getRequest<object>() : context.getArgs();
}

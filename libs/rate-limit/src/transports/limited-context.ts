import { type ExecutionContext, Logger } from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import type { LimitedRequest } from '../limiter/limited-request.js';

/**
 * The transports the guard limits, and what a rule reads of each: the request an HTTP route or a
 * GraphQL operation runs for (its client address, whether its client has gone), or the client of a
 * WebSocket message. Read by shape, so `@nestjs/graphql` and `@nestjs/websockets` stay optional.
 */
export type LimitedTransport = 'http' | 'graphql' | 'ws';

/** What of an HTTP request's connection says who the client is and whether it is still there (a `net.Socket`). */
interface ClientConnection {
  remoteAddress?: string;
  localAddress?: string;
  destroyed?: boolean;
  readableEnded?: boolean;
}

/** Where the address of the client lives on what the transport gives. */
interface Addressed {
  ip?: string;
  socket?: ClientConnection;
  /** Fastify's request, inside a GraphQL context. */
  raw?: { socket?: ClientConnection };
  /** Express's app: its settings. */
  app?: { settings?: { 'trust proxy'?: unknown } };
}

/** A WebSocket client: socket.io's (`handshake`, `conn`) or `ws`'s (`_socket`). */
interface WsClient {
  handshake?: { address?: string; headers?: Record<string, string | string[] | undefined> };
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
  // As `switchToHttp().getRequest()` reads it, without the functions that call adds to the context.
  if (transport === 'http') return context.getArgByIndex<object>(0);
  if (transport !== 'graphql') return undefined;
  const gql = context.getArgByIndex<{ req?: object; request?: object; reply?: { request?: object } } | undefined>(2);
  // Mercurius's context holds the reply, which holds the request.
  return gql?.req ?? gql?.request ?? gql?.reply?.request;
}

/**
 * The client's address, and whether it has gone: its connection closed, reset, or shut by the
 * client (`connectionEnded`) before the decision.
 */
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
  if (!socket) return { address: request.ip, gone: true };
  return { address: addressOf(request, socket), gone: connectionEnded(socket) };
}

/**
 * The address of a request with a connection: its `ip`, which Express derives anew on each read
 * through proxy-addr (about 1 µs); while the app trusts no proxy (Express's default setting,
 * `false`) that is the connection's address, read as such. An `ip` of the request's own is kept.
 */
function addressOf(request: Addressed, socket: ClientConnection): string | undefined {
  if (request.app?.settings?.['trust proxy'] === false && !Object.hasOwn(request, 'ip')) {
    return socket.remoteAddress ?? request.ip;
  }
  return request.ip ?? socket.remoteAddress;
}

/**
 * The client's `User-Agent`: of the HTTP request (a GraphQL operation's too), or of the handshake
 * of a socket.io client; undefined otherwise (a `ws` client keeps no headers).
 */
export function userAgentOf(context: ExecutionContext): string | undefined {
  const headers =
    context.getType<string>() === 'ws'
      ? context.switchToWs().getClient<WsClient>().handshake?.headers
      : (httpRequestOf(context) as { headers?: Record<string, string | string[] | undefined> } | undefined)?.headers;
  const agent = headers?.['user-agent'];
  return typeof agent === 'string' ? agent : undefined;
}

/**
 * Whether a request's client has ended its connection:
 * - destroyed: closed, or reset and Node has read the reset;
 * - its reading side ended: the client shut its sending side (a FIN). It may have gone, or be
 *   half-closed and still reading: TCP tells which only once an answer is written. So a request
 *   that would wait for admissions in flight stops waiting, as for a client gone, and one decided
 *   at once is answered, the server keeping such connections open for it (`answerHalfClosedClients`);
 * - reset, not read yet: the kernel has the reset (it arrives with or right after the request, and
 *   Node reads it only at its next turn for I/O), so the socket still looks open but its peer has
 *   no address any more. A TCP socket always has a local address, which tells it from a server
 *   listening on a Unix socket, whose connections never have a peer address.
 */
function connectionEnded(socket: ClientConnection): boolean {
  if (socket.destroyed === true || socket.readableEnded === true) return true;
  return socket.remoteAddress === undefined && socket.localAddress !== undefined;
}

/**
 * Has Node's HTTP server answer clients that half-close their connections (send the request, then
 * shut their sending side, and read the answer), for the HTTP server of Express and of Fastify
 * alike. By default (`httpAllowHalfOpen` false) Node ends a connection as soon as its client shuts
 * its side, so an answer not written by then never leaves: every handler slower than that, and
 * every request decided after a store call, is lost to such a client, and a `countOn` rule counts
 * it as the response that never finished. Kept half-open, the server writes the answer and then
 * closes; a client that left altogether is met by the write, as any other is.
 *
 * @param server what the HTTP adapter's `getHttpServer()` returns; anything else is left alone.
 */
export function answerHalfClosedClients(server: unknown): void {
  const http = server as { httpAllowHalfOpen?: unknown } | undefined;
  if (typeof http?.httpAllowHalfOpen === 'boolean') http.httpAllowHalfOpen = true;
}

/**
 * Whether an Express response (a Node response, read first: a miss on `raw` walks its long
 * prototype chain) or a Fastify reply (wrapping one as `raw`) has gone out.
 */
export function headersSent(response: object): boolean {
  return (response as ServerResponse).headersSent ?? (response as { raw?: ServerResponse }).raw?.headersSent ?? false;
}

/**
 * What one guard invocation is known by, so a guard registered twice (globally and with
 * `@UseGuards`) decides once: the HTTP request; for a GraphQL field or a WebSocket message, the
 * arguments array Nest hands every guard of that one call.
 */
export function invocationOf(context: ExecutionContext): object {
  return context.getType<string>() === 'http' ? context.getArgByIndex<object>(0) : context.getArgs();
}

/**
 * What the limiter reads of a request, read from its context: the transport's part of the limiter's
 * `LimitedRequest`. The address is read once (a `by: 'ip'` rule and an address ban both ask);
 * whether the client has gone, each time it is asked.
 */
export class ContextRequest implements LimitedRequest {
  private client: { address: string | undefined } | undefined;

  constructor(readonly context: ExecutionContext) {}

  get address(): string | undefined {
    return (this.client ??= clientOf(this.context)).address;
  }

  gone(): boolean {
    return clientOf(this.context).gone;
  }

  userAgent(): string | undefined {
    return userAgentOf(this.context);
  }

  onGone(listener: () => void): () => void {
    const [emitter, events] = connectionOf(this.context);
    if (!emitter) return () => undefined;
    let called = false;
    const once = () => {
      if (called) return;
      called = true;
      listener();
    };
    for (const event of events) emitter.on(event, once);
    return () => {
      for (const event of events) emitter.off(event, once);
    };
  }
}

/** Something that tells of its end by an event: a socket, a socket.io or `ws` client. */
interface Ending {
  on(event: string, listener: () => void): unknown;
  off(event: string, listener: () => void): unknown;
}

/** What tells that a request's client goes, and by which events (those `clientOf` reads as gone). */
function connectionOf(context: ExecutionContext): [Ending | undefined, readonly string[]] {
  if (context.getType<string>() === 'ws') {
    const client = context.switchToWs().getClient<WsClient & Partial<Ending>>();
    if (typeof client.on !== 'function') return [undefined, []];
    return [client as Ending, client.handshake ? ['disconnect'] : ['close']];
  }
  const request = httpRequestOf(context) as
    { socket?: Partial<Ending>; raw?: { socket?: Partial<Ending> } } | undefined;
  const socket = request?.socket ?? request?.raw?.socket;
  return typeof socket?.on === 'function' ? [socket as Ending, ['close', 'end']] : [undefined, []];
}

/** What of an Express or a Fastify request says whether the app trusts a proxy. */
interface ProxiedRequest {
  headers?: Record<string, string | string[] | undefined>;
  /** Express's app: its `trust proxy` setting. */
  app?: { get?: (setting: string) => unknown };
  /** Fastify's raw request; Fastify defines `ips` only on the requests of a server with `trustProxy`. */
  raw?: object;
  ips?: unknown;
}

const SETTING = {
  express: "Express's 'trust proxy' (app.set('trust proxy', 1) behind one proxy)",
  fastify: "Fastify's 'trustProxy' (new FastifyAdapter({ trustProxy: 1 }) behind one proxy)",
} as const;

/**
 * Says once when requests come through a proxy the app does not trust: they carry
 * `X-Forwarded-For` (or `Forwarded`) while the adapter's trust setting is unset, so every client
 * behind the proxy has the proxy's address and `by: 'ip'` counts them all in one bucket. It changes
 * nothing that is counted: a client that sends the header itself, with no proxy in front, is rightly
 * not believed. Until it has said so, a request costs one header lookup; after, nothing.
 */
export class UntrustedProxyCheck {
  private said = false;

  check(context: ExecutionContext): void {
    if (this.said) return;
    const request = httpRequestOf(context) as ProxiedRequest | undefined;
    const headers = request?.headers;
    if (!headers) return;
    const header =
      headers['x-forwarded-for'] !== undefined
        ? 'X-Forwarded-For'
        : headers.forwarded !== undefined
          ? 'Forwarded'
          : undefined;
    if (!header) return;
    const adapter = untrustingAdapter(request!);
    if (!adapter) return;
    this.said = true;
    new Logger('RateLimit').warn(
      `Requests carry ${header} but the app trusts no proxy: each has the address of the proxy it came through, so clients behind one proxy share its limits. Behind a proxy or load balancer, set ${SETTING[adapter]}; without one, clients send the header themselves and it is rightly ignored. Said once.`,
    );
  }
}

/** The adapter of a request whose app trusts no proxy; undefined when it trusts one, or is neither. */
function untrustingAdapter(request: ProxiedRequest): keyof typeof SETTING | undefined {
  if (typeof request.app?.get === 'function') return request.app.get('trust proxy') ? undefined : 'express';
  if (request.raw !== undefined) return 'ips' in request ? undefined : 'fastify';
  return undefined;
}

import type { ExecutionContext } from '@nestjs/common';
import { isIPv4, isIPv6 } from 'node:net';

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
  return { address: request.ip ?? socket.remoteAddress, gone: connectionEnded(socket) };
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
 * The identity of a client address for `by: 'ip'`. IPv4 (and IPv4-mapped IPv6) as it is; IPv6
 * reduced to its first `ipv6PrefixBits` bits (`2001:db8:1:2::/64`), since one subscriber is usually
 * given a whole /64 and could otherwise rotate addresses to escape the limit.
 */
export function clientAddressIdentity(address: string, ipv6PrefixBits: number): string {
  if (address.startsWith('::ffff:') && isIPv4(address.slice(7))) return address.slice(7);
  if (!isIPv6(address)) return address;
  const groups = expandIPv6(address);
  // ::ffff:a.b.c.d in any spelling (upper case, zeros written out, hex groups) is an IPv4 client.
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) {
    return [groups[6] >> 8, groups[6] & 0xff, groups[7] >> 8, groups[7] & 0xff].join('.');
  }
  if (ipv6PrefixBits >= 128) return address;
  const masked = groups.map((group, i) => {
    const bitsBefore = i * 16;
    if (bitsBefore + 16 <= ipv6PrefixBits) return group;
    if (bitsBefore >= ipv6PrefixBits) return 0;
    const keep = ipv6PrefixBits - bitsBefore;
    return group & (0xffff << (16 - keep)) & 0xffff;
  });
  return `${compressIPv6(masked)}/${ipv6PrefixBits}`;
}

/** An IPv6 address's eight groups (an IPv4 tail as two, a zone index dropped), checked with `isIPv6` first. */
export function expandIPv6(address: string): number[] {
  let text = address.split('%')[0]; // zone index
  const lastColon = text.lastIndexOf(':');
  const tail = text.slice(lastColon + 1);
  if (isIPv4(tail)) {
    const [a, b, c, d] = tail.split('.').map(Number);
    text = `${text.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, rest] = text.split('::');
  const left = head ? head.split(':') : [];
  const right = rest === undefined ? [] : rest ? rest.split(':') : [];
  const zeros = rest === undefined ? 0 : 8 - left.length - right.length;
  return [...left, ...Array.from({ length: zeros }, () => '0'), ...right].map((group) => parseInt(group, 16));
}

function compressIPv6(groups: number[]): string {
  // Replace the longest run of zero groups (two or more) with '::'.
  let bestStart = -1;
  let bestLength = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i += 1;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j += 1;
    if (j - i > bestLength) {
      bestStart = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = groups.map((group) => group.toString(16));
  if (bestStart < 0) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLength).join(':')}`;
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
 * What one guard invocation is known by, so a guard registered twice (globally and with
 * `@UseGuards`) decides once: the HTTP request; for a GraphQL field or a WebSocket message, the
 * arguments array Nest hands every guard of that one call.
 */
export function invocationOf(context: ExecutionContext): object {
  return context.getType<string>() === 'http' ? context.getArgByIndex<object>(0) : context.getArgs();
}

import type { ExecutionContext } from '@nestjs/common';
import type { IncomingMessage, ServerResponse } from 'node:http';

/** Responses already watched: the guard may admit a request in two parts (before and after the app's guards). */
const WATCHED = new WeakSet<ServerResponse>();

/**
 * Ends an `@Sse()` response once its client shuts its side of the connection. The guard has the
 * app's HTTP server keep half-closed connections open for their answer (`answerHalfClosedClients`),
 * and such a connection learns that its client has gone only when something is written to it: a
 * stream that stays quiet (an answer waiting on its model, events that come rarely) would be kept,
 * its handler's Observable subscribed and its cost unsettled, for as long as the server runs, and
 * `app.close()` would wait for it. A client of an event stream (an `EventSource`) never half-closes
 * to read on: one that shuts its side has left. Destroying the response closes the connection,
 * which Nest's SSE path takes for the client's departure: it unsubscribes the handler's stream,
 * and the request is settled at what its handler reported so far. For `@Sse()` routes only
 * (`RateLimitRuleRegistry.isEventStream`).
 */
export function endEventStreamWhenClientLeaves(context: ExecutionContext): void {
  // Express hands us the Node request and response; Fastify its own, wrapping them as `raw`.
  const request = context.getArgByIndex<{ raw?: IncomingMessage } & IncomingMessage>(0);
  const response = context.getArgByIndex<{ raw?: ServerResponse } & ServerResponse>(1);
  const raw = response.raw ?? response;
  const socket = (request.raw ?? request).socket;
  if (!socket || WATCHED.has(raw)) return;
  WATCHED.add(raw);
  const left = () => raw.destroy();
  // It may have shut its side while the request waited for its decision: that 'end' is past.
  if (socket.readableEnded) {
    left();
    return;
  }
  socket.once('end', left);
  // A kept-alive connection outlives its response: the next request on it is none of this one's.
  raw.once('close', () => socket.off('end', left));
}

import { WebSocket } from 'ws';

/** Every client `connectWs` opened and `closeWsClients` has not closed yet. */
const open = new Set<WebSocket>();

/**
 * A plain WebSocket client (the `ws` package) of a gateway on Nest's `WsAdapter`, once open.
 * `from` is the loopback address it connects from (every address of 127.0.0.0/8 is this
 * machine's), so clients can differ by address; `headers` go with its upgrade request.
 */
export async function connectWs(
  url: string,
  { from, headers }: { from?: string; headers?: Record<string, string> } = {},
): Promise<WebSocket> {
  const socket = new WebSocket(url.replace('[::1]', '127.0.0.1'), {
    ...(from ? { localAddress: from } : {}),
    ...(headers ? { headers } : {}),
  });
  open.add(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once('open', () => resolve());
    socket.once('error', reject);
  });
  return socket;
}

/** For `afterEach`: closes every client still open. */
export function closeWsClients(): void {
  for (const socket of open) socket.terminate();
  open.clear();
}

/** A message of `WsAdapter`'s format, both ways: `{ event, data }` as JSON. */
export interface WsMessage<T = unknown> {
  event: string;
  data: T;
}

/** The next message the server sends the client. */
export function nextWsMessage<T = unknown>(socket: WebSocket): Promise<WsMessage<T>> {
  return new Promise((resolve, reject) => {
    const onClose = () => reject(new Error('the server closed the connection before answering'));
    socket.once('close', onClose);
    socket.once('message', (raw) => {
      socket.off('close', onClose);
      resolve(JSON.parse(raw.toString()) as WsMessage<T>);
    });
  });
}

/**
 * Sends one message and resolves with the server's answer to it: the handler's response, or the
 * `exception` event Nest's gateway filter sends a native WebSocket client. The client has no other
 * message in flight, so the next message is the answer.
 */
export function sendWs<T = unknown>(socket: WebSocket, event: string, data: object = {}): Promise<WsMessage<T>> {
  const answer = nextWsMessage<T>(socket);
  socket.send(JSON.stringify({ event, data }));
  return answer;
}

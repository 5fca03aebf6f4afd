import { io, type Socket } from 'socket.io-client';

/** Every client `connectSocket` opened and `disconnectSockets` has not closed yet. */
const open = new Set<Socket>();

/**
 * A socket.io client of an app listening on loopback (`app.getUrl()`), on the WebSocket transport,
 * once connected. `headers` go with its handshake (a proxy's `x-forwarded-for`).
 */
export async function connectSocket(url: string, headers?: Record<string, string>): Promise<Socket> {
  const socket = io(url.replace('[::1]', '127.0.0.1'), {
    transports: ['websocket'],
    forceNew: true,
    ...(headers ? { extraHeaders: headers } : {}),
  });
  open.add(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', () => resolve());
    socket.once('connect_error', reject);
  });
  return socket;
}

/** For `afterEach`: closes every client still open. */
export function disconnectSockets(): void {
  for (const socket of open) socket.disconnect();
  open.clear();
}

/** Sends a message: its acknowledgement, or the `exception` event Nest's gateway filter emits. */
export function sendMessage<E = unknown>(
  socket: Socket,
  event: string,
  data: object = {},
): Promise<{ ack: unknown } | { exception: E }> {
  return new Promise((resolve) => {
    const onException = (exception: E) => resolve({ exception });
    socket.once('exception', onException);
    socket.emit(event, data, (ack: unknown) => {
      socket.off('exception', onException);
      resolve({ ack });
    });
  });
}

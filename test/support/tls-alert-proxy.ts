import { type Server, type Socket, connect, createServer } from 'node:net';

/** A loopback proxy in front of a TLS server that makes the server send an alert (`AlertProxy`). */
export interface AlertProxy {
  readonly port: number;
  /** Connections that got the server's handshake and its alert in one write. */
  readonly alertsSent: number;
  close(): Promise<void>;
}

/** A TLS handshake record one byte long: no message fits in it, and the server answers with an alert. */
const MALFORMED_RECORD = Buffer.from('160303000100', 'hex');

/**
 * Forwards each connection to `port`, adds a malformed record after the client's first bytes (its
 * ClientHello), holds what the server sends (its handshake, then the alert it ends with) and gives
 * it to the client in one write. The client completes the handshake and reads the alert in one go:
 * with the server's certificate refused, its TLS socket emits two errors.
 */
export async function startAlertProxy(port: number): Promise<AlertProxy> {
  let alertsSent = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = connect(port, '127.0.0.1');
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('error', () => undefined);
      socket.on('close', () => sockets.delete(socket));
    }
    const held: Buffer[] = [];
    client.once('data', (hello: Buffer) => upstream.write(Buffer.concat([hello, MALFORMED_RECORD])));
    upstream.on('data', (chunk: Buffer) => held.push(chunk));
    upstream.on('close', () => {
      alertsSent += 1;
      client.end(Buffer.concat(held));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    get alertsSent() {
      return alertsSent;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

import type { LoggerService } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { withDeadline } from './redis-timeout.js';
import { isCluster } from './is-cluster.js';
import { mastersOf } from './masters.js';
import { reconnectDelay } from './redis-connection.js';

/** How long the app's start waits for Redis before serving without it. */
const BOOTSTRAP_CONNECT_MS = 3_000;

/**
 * The life of the library's connection: its own client (made by `redis-connection.ts`), connected
 * when the app starts and closed when it stops, and kept connected in between; or one the
 * application supplied, left as it is. Tells who needs it of each (re)connect (`whenReady`).
 */
export class ConnectionLife {
  /** The client's last error event: why a connection failed (a certificate refused, a password). */
  private connectionError: Error | undefined;
  private readonly readyListeners: (() => void)[] = [];
  private shuttingDown = false;

  /** @param owned whether the library made the client (and so connects and closes it). */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly owned: boolean,
    private readonly logger: LoggerService,
  ) {
    client.on('ready', this.onReady);
    // An 'error' event without a listener is printed for every reconnect attempt; the limiter
    // reports failures itself, by sampling, when a request meets them.
    if (owned) client.on('error', (error: Error) => (this.connectionError = error));
    if (owned) client.on('end', this.onEnd);
  }

  /** Where the client connects, for logs. */
  describe(): string {
    const { client } = this;
    if (!this.owned) return 'application-supplied client';
    if (isCluster(client)) return 'cluster';
    const { host, port, path, sentinels, name } = client.options;
    if (sentinels?.length) return `sentinels ${sentinels.map((s) => `${s.host}:${s.port}`).join(',')} for ${name}`;
    return path ? `unix:${path}` : `${host}:${port}`;
  }

  /** Whether Redis answers a PING within `timeoutMs` (every master of a Cluster). */
  async reachable(timeoutMs: number): Promise<boolean> {
    const nodes = mastersOf(this.client);
    if (nodes.length === 0) return false;
    try {
      await Promise.all(nodes.map((node) => withDeadline(node.ping(), timeoutMs, 'PING')));
      return true;
    } catch {
      return false;
    }
  }

  /** Calls `listener` each time the connection is (re)established and ready for commands. */
  whenReady(listener: () => void): void {
    this.readyListeners.push(listener);
  }

  /**
   * The app starts: connects a client of ours, waiting a bounded time. Resolves with whether the
   * connection is ready for the start's checks; false (said in the log) when Redis is not reachable yet.
   */
  async connect(): Promise<boolean> {
    const { client } = this;
    if (this.owned && client.status === 'wait') {
      // connect() settles only once the server answers; a paused server, or sentinels that are all
      // down, would hold the app's start for ever. Wait a bounded time, then serve by the store-error policies.
      const connecting = client.connect();
      connecting.catch(() => undefined);
      try {
        await withDeadline(connecting, BOOTSTRAP_CONNECT_MS, 'the connection');
      } catch (error) {
        // Not fatal: the client keeps reconnecting, and until it is back requests follow the store-error policies.
        // ioredis rejects a failed connect with 'Connection is closed'; its error event says why.
        const why = this.connectionError ?? error;
        this.logger.error(`Redis (${this.describe()}) is not reachable yet: ${String(why)}`);
        return false;
      }
    }
    return client.status === 'ready';
  }

  /** The app stops: a client of ours is closed, once the replies in flight have arrived. */
  async close(): Promise<void> {
    this.shuttingDown = true;
    const { client } = this;
    client.off('ready', this.onReady);
    if (!this.owned || client.status === 'end') return;
    const ended = new Promise<void>((resolve) => client.once('end', resolve));
    try {
      // QUIT lets replies in flight arrive; waiting for 'end' means the socket is gone when the app is.
      await withDeadline(
        client.quit().then(() => ended),
        1_000,
        'QUIT',
      );
    } catch {
      client.disconnect();
    }
  }

  /** The app does not start: a client of ours is closed at once. */
  disconnect(): void {
    if (this.owned) this.client.disconnect();
  }

  /**
   * A client of ours ends only when the app shuts down: ioredis ends a Sentinel client for good when
   * `+switch-master` arrives while it is reconnecting to the master that failed (its failover
   * detector closes the connector in the middle of asking the sentinels). Every request would then
   * go to the store-error policy until a restart (`test/integration/failover-loss.spec.ts` met it on
   * a busy machine). Connect again, as a reconnect would.
   */
  private readonly onEnd = () => {
    const { client } = this;
    if (this.shuttingDown) return;
    setTimeout(() => {
      if (!this.shuttingDown && client.status === 'end') client.connect().catch(() => undefined);
    }, reconnectDelay(1)).unref();
  };

  private readonly onReady = () => {
    for (const listener of this.readyListeners) listener();
  };
}

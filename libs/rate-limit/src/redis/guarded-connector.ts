import type { RedisOptions } from 'ioredis';
import type { SentinelConnector, StandaloneConnector } from 'ioredis/built/connectors/index.js';
import { type FollowedMaster, withoutIdleSwitches } from './switch-master-announcement.js';

/** @internal What ioredis's `Connector` option takes: a class it makes a connection's sockets with. */
export type ConnectorClass = NonNullable<RedisOptions['Connector']>;

/** @internal ioredis's connectors, loaded where ioredis is (`redis-connection.ts`): it exports the Sentinel one only. */
export interface IoredisConnectors {
  StandaloneConnector: typeof StandaloneConnector;
  SentinelConnector: typeof SentinelConnector;
}

type Socket = Awaited<ReturnType<InstanceType<ConnectorClass>['connect']>>;

/**
 * @internal
 * The connectors ioredis would use (standalone, or asking the sentinels), each socket they open
 * given an error listener for its life. ioredis listens for a socket's first error only (`once`),
 * and a TLS socket can emit two: the server's certificate refused, then an alert the server sent in
 * the same read (Node emits both). The second, with no listener, was an uncaught exception that
 * ended the app. An error nobody else hears goes to `onUnheardError`; ioredis reports the rest.
 * A Sentinel client's own connections to the sentinels get the same guard, and follow only the
 * failover announcements that move it (`withoutIdleSwitches`).
 */
export function guardedConnector(
  connectors: IoredisConnectors,
  onUnheardError: (error: Error) => void,
): ConnectorClass {
  const { StandaloneConnector, SentinelConnector } = connectors;
  const guard = (socket: Socket): Socket => {
    socket.on('error', (error: Error) => {
      // This listener and ioredis's `once`, still there: ioredis has it.
      if (socket.listenerCount('error') > 1) return;
      onUnheardError(error);
    });
    return socket;
  };

  class GuardedStandaloneConnector extends StandaloneConnector {
    override connect(...args: Parameters<InstanceType<typeof StandaloneConnector>['connect']>): Promise<Socket> {
      return super.connect(...args).then(guard);
    }
  }

  class GuardedSentinelConnector extends SentinelConnector {
    override connect(...args: Parameters<InstanceType<typeof SentinelConnector>['connect']>): Promise<Socket> {
      return super.connect(...args).then(guard);
    }

    /** The master this connector follows, and where it is connected now. */
    followed(): FollowedMaster {
      return { name: this.options.name, socket: this.stream, natMap: this.options.natMap };
    }
  }
  // The clients that ask the sentinels, and that watch them for a failover, are made by this
  // (private) method, with options spread last: theirs get the guard too, and the watching ones
  // hear only the announcements that move this connector's client.
  const sentinelClient = Reflect.get(SentinelConnector.prototype, 'connectToSentinel') as (
    endpoint: unknown,
    options?: object,
  ) => Parameters<typeof withoutIdleSwitches>[0];
  Reflect.set(
    GuardedSentinelConnector.prototype,
    'connectToSentinel',
    function (this: GuardedSentinelConnector, endpoint: unknown, options?: object) {
      const client = sentinelClient.call(this, endpoint, { Connector: GuardedStandaloneConnector, ...options });
      return withoutIdleSwitches(client, () => this.followed());
    },
  );

  return class GuardedConnector {
    constructor(options: RedisOptions) {
      return options.sentinels?.length
        ? new GuardedSentinelConnector(options as never)
        : new GuardedStandaloneConnector(options as never);
    }
  } as unknown as ConnectorClass;
}

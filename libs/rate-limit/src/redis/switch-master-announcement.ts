import type { NatMap } from 'ioredis';

/** The channel on which each sentinel announces a failover it has taken in. */
const SWITCH_MASTER = '+switch-master';

/** @internal What a Sentinel client follows: read when an announcement arrives. */
export interface FollowedMaster {
  /** The master's name, as the sentinels know it. */
  readonly name: string | undefined;
  /** The client's socket to the server it takes for the master, if one is open. */
  readonly socket: { readonly remoteAddress?: string; readonly remotePort?: number } | undefined;
  /** The client's `natMap`: how an address the sentinels announce is reached from here. */
  readonly natMap: NatMap | undefined;
}

/**
 * @internal
 * Whether a `+switch-master` announcement (`<name> <old ip> <old port> <new ip> <new port>`) moves
 * the client: it names the client's master, and a server other than the one the client is on.
 *
 * Each sentinel announces a failover once it takes the promoted server for the master: the one
 * that led it when it ends, the others as they hear of it, up to a hello period (2 s) later. A
 * client whose master died asks the sentinels again and again, and may reach the promoted server
 * between those announcements. ioredis's failover detector reconnects on any announcement it hears
 * (any master's, naming any server), so the late ones took that client off the new master it had
 * just reached: its calls failed until it was back (50 ms or more), often enough in a row to open
 * the circuit breaker, and requests were decided without Redis for a while after the failover.
 * An announcement that names where the client already is tells it nothing.
 */
export function movesClient(message: string, followed: FollowedMaster): boolean {
  const [name, , , host, port] = message.split(' ');
  if (name !== followed.name) return false;
  const { socket } = followed;
  if (socket?.remoteAddress === undefined || socket.remotePort === undefined) return true;
  const announced = reachedAt(host, Number(port), followed.natMap);
  return !(announced.port === socket.remotePort && sameHost(announced.host, socket.remoteAddress));
}

/**
 * Makes a sentinel client keep from its listeners the `+switch-master` announcements that do not
 * move the client following `followed` (`movesClient`): ioredis's failover detector listens for
 * them on such clients, and reads only the channel.
 */
export function withoutIdleSwitches<T extends { emit(event: string | symbol, ...args: unknown[]): boolean }>(
  sentinel: T,
  followed: () => FollowedMaster,
): T {
  const emit = sentinel.emit.bind(sentinel);
  sentinel.emit = (event: string | symbol, ...args: unknown[]) => {
    const [channel, message] = args;
    if (event === 'message' && channel === SWITCH_MASTER && !movesClient(String(message), followed())) return false;
    return emit(event, ...args);
  };
  return sentinel;
}

/** An announced address as this client reaches it: through `natMap`, as ioredis connects. */
function reachedAt(host: string, port: number, natMap: NatMap | undefined): { host: string; port: number } {
  const key = `${host}:${port}`;
  const mapped = typeof natMap === 'function' ? natMap(key) : natMap?.[key];
  return mapped ?? { host, port };
}

/** A socket reports an IPv4 peer of a dual-stack socket as `::ffff:a.b.c.d`. */
function sameHost(announced: string, remoteAddress: string): boolean {
  return announced === remoteAddress || `::ffff:${announced}` === remoteAddress;
}

import type { Writable } from 'node:stream';
import type { Cluster, Redis } from 'ioredis';

/**
 * Sends the commands made in one turn of the event loop to Redis in one write. ioredis writes each
 * command to its socket as it is made, and that system call, not the script, is most of what a
 * decision costs the app (and the read of each, most of what it costs Redis): under concurrent
 * requests, one write for all of a turn's commands served about three times the decisions per
 * second of one write each (`npm run bench:core`).
 *
 * The first command of a turn corks the connection's socket; the eighth held, or else `setImmediate`
 * (which runs once the turn's I/O callbacks are done: the requests that arrived together, the
 * replies read together), uncorks it, and Node writes what it holds at once. A command waits for nothing but the rest of
 * its own turn, and its deadline starts when it goes out (`CallDeadlines.sent`): a turn stalled by
 * the app's own work before the write must not look like a slow Redis. Commands of an application-supplied
 * client made in that turn go in the same write, in their order. On Cluster the masters' sockets
 * are corked together.
 */
/**
 * Calls held at most before they go: Redis starts on them while the app makes the rest. Held until
 * the end of the turn, a batch left Redis idle while the app decided the replies of the last one,
 * and the app idle while Redis ran the next (about half the decisions per second at 16 in flight);
 * sent one by one, each call paid its write. 8 measured best of 2, 4, 8, 16 and a whole turn.
 */
const MAX_HELD = 8;

export class WriteBatches {
  private corked: Writable[] | undefined;
  private held = 0;

  /** @param sent told each time held commands have gone out. */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly sent: () => void,
  ) {}

  /**
   * Call before a command is made: it goes out with the rest of this turn's. Returns whether it is
   * held (false while not connected: it fails or goes at once).
   */
  hold(): boolean {
    if (this.corked) {
      this.held += 1;
      // Once this call is written (right after this returns), the batch goes; the next starts another.
      if (this.held === MAX_HELD) queueMicrotask(this.release);
      return true;
    }
    const streams = socketsOf(this.client);
    if (streams.length === 0) return false;
    for (const stream of streams) stream.cork();
    this.corked = streams;
    this.held = 1;
    setImmediate(this.release);
    return true;
  }

  private readonly release = (): void => {
    const streams = this.corked;
    if (!streams) return;
    this.corked = undefined;
    for (const stream of streams) stream.uncork();
    this.sent();
  };
}

/** The sockets commands are written to now: none while not connected. */
function socketsOf(client: Redis | Cluster): Writable[] {
  if (!client.isCluster) return client.status === 'ready' ? [(client as Redis).stream] : [];
  return (client as Cluster)
    .nodes('master')
    .filter((node) => node.status === 'ready')
    .map((node) => node.stream);
}

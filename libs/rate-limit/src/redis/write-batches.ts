import type { Writable } from 'node:stream';
import type { Cluster, Redis } from 'ioredis';

/**
 * Commands in one write at most: Redis starts on them while the app makes the rest. A whole turn
 * in one write left Redis idle while the app decided the replies of the last batch, and the app
 * idle while Redis ran the next (0.6x the one-EVALSHA floor's decisions per second at 16 in flight,
 * 1.6x with 8); one write per command paid a system call each. 8 measured best of 4, 8 and 16.
 */
const MAX_HELD = 8;

/**
 * Sends the commands made in one turn of the event loop to Redis a few writes at a time. ioredis
 * writes each command to its socket as it is made, and that system call, not the script, is most
 * of what a decision costs the app (and the read of each, most of what it costs Redis).
 *
 * The first command of a batch corks the connection's socket; the ninth, or else `setImmediate`
 * (which runs once the turn's I/O callbacks are done: the requests that arrived together, the
 * replies read together), uncorks it, and Node writes what it holds at once. A command waits for
 * nothing but the rest of its own turn, and its deadline starts when it goes out
 * (`CallDeadlines.sent`): a turn stalled by the app's own work before the write must not look like
 * a slow Redis. Commands of an application-supplied client made meanwhile go in the same write, in
 * their order. On Cluster the masters' sockets are corked together.
 */
export class WriteBatches {
  private corked: Writable[] | undefined;
  private held = 0;
  /** A release at the end of this turn is due (`setImmediate`). */
  private releaseDue = false;

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
      if (this.held < MAX_HELD) {
        this.held += 1;
        return true;
      }
      // A full batch goes now, and this command starts the next. Now, not in a microtask: the calls
      // of one read of replies all come back in the same round of microtasks, so a release queued
      // behind them sent the whole turn as one batch after all.
      this.release();
    }
    const streams = socketsOf(this.client);
    if (streams.length === 0) return false;
    for (const stream of streams) stream.cork();
    this.corked = streams;
    this.held = 1;
    if (!this.releaseDue) {
      this.releaseDue = true;
      setImmediate(this.releaseAtTurnEnd);
    }
    return true;
  }

  private readonly releaseAtTurnEnd = (): void => {
    this.releaseDue = false;
    this.release();
  };

  private release(): void {
    const streams = this.corked;
    if (!streams) return;
    this.corked = undefined;
    for (const stream of streams) stream.uncork();
    this.sent();
  }
}

/** The sockets commands are written to now: none while not connected. */
function socketsOf(client: Redis | Cluster): Writable[] {
  if (!client.isCluster) return client.status === 'ready' ? [(client as Redis).stream] : [];
  return (client as Cluster)
    .nodes('master')
    .filter((node) => node.status === 'ready')
    .map((node) => node.stream);
}

import { Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { isCluster } from '../is-cluster.js';
import type { RedisService } from '../redis.service.js';

/**
 * While no replica is seen, how often a standalone server is asked again (`INFO replication`): a
 * replica attached while the connection stays up sends the clients no news. One small command per
 * interval per instance, and none once the check is on.
 */
export const REPLICA_LOOKUP_INTERVAL_MS = 10_000;

/** A look's own deadline: off the request path, and never stacking up behind a hung server. */
const LOOKUP_TIMEOUT_MS = 2_000;

/**
 * Why a replica can be promoted over the server a client writes to, by the topology alone: Sentinel
 * and Cluster exist to promote one. Undefined for a standalone server, which must be asked.
 */
export function promotableByDesign(client: Redis | Cluster): string | undefined {
  if (isCluster(client)) return 'Redis Cluster';
  if (client.options.sentinels?.length) return 'Redis Sentinel';
  return undefined;
}

/** The replicas a standalone server reports connected (`INFO replication`, `connected_slaves`). */
export async function connectedReplicas(redis: RedisService, client: Redis): Promise<number> {
  const info = await redis.runner.operation(() => client.info('replication'), 'INFO replication', LOOKUP_TIMEOUT_MS);
  return Number(/connected_slaves:(\d+)/.exec(info)?.[1] ?? 0);
}

/**
 * `failover.detectLostWrites: 'auto'`: turns the lost-write check on once a replica can be promoted
 * (`promotableByDesign`, `connectedReplicas`), and never off again (a replica seen once may be
 * promoted later, even while its link is down). Until then the store has no check at all: no memory
 * of windows, no bookkeeping on any request. It looks at the start, on each (re)connect (a promoted master, a
 * server restarted with replicas), and every `REPLICA_LOOKUP_INTERVAL_MS` while it has seen none.
 * Says in one log line which way it decided, and again when it turns the check on.
 */
export class LostWriteCheckSwitch implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private timer: NodeJS.Timeout | undefined;
  private on = false;
  /** Why the check was turned on at construction (Sentinel, Cluster), to be said at the start. */
  private why: string | undefined;
  private saidOff = false;
  private looking: Promise<void> | undefined;
  private closed = false;

  constructor(
    private readonly redis: RedisService,
    /** Turns the check on in the store. Called once. */
    private readonly turnOn: () => void,
  ) {
    const client = redis.client;
    const byDesign = promotableByDesign(client);
    if (byDesign !== undefined) {
      // Before the first request, and for good: no server needs asking. (Said at the start, once the
      // app's logger is in place.)
      this.on = true;
      this.why = byDesign;
      turnOn();
      return;
    }
    redis.connection.whenReady(() => void this.look());
  }

  async onApplicationBootstrap(): Promise<void> {
    if (this.why !== undefined) this.say(this.why);
    // RedisService has connected by now (it bootstraps first), or keeps trying; the ready event
    // looks then.
    await this.look();
    if (this.on) return;
    this.timer = setInterval(() => void this.look(), REPLICA_LOOKUP_INTERVAL_MS);
    this.timer.unref();
  }

  onApplicationShutdown(): void {
    this.closed = true;
    clearInterval(this.timer);
  }

  /** One look at a time; a look asked for meanwhile is the one running. */
  private look(): Promise<void> {
    this.looking ??= this.lookOnce().finally(() => (this.looking = undefined));
    return this.looking;
  }

  private async lookOnce(): Promise<void> {
    const client = this.redis.client;
    if (this.on || this.closed || isCluster(client) || client.status !== 'ready') return;
    let replicas: number;
    try {
      replicas = await connectedReplicas(this.redis, client);
    } catch {
      return; // Not known this time (a hung server, an ACL without INFO): asked again later.
    }
    if (this.on || this.closed) return;
    if (replicas > 0) {
      this.switchOn(`the server reports ${replicas} connected replica${replicas === 1 ? '' : 's'}`);
      return;
    }
    if (this.saidOff) return;
    this.saidOff = true;
    this.logger.log(
      'Lost-write check off: a lone Redis server, with no replica a failover could promote ' +
        `(failover.detectLostWrites: 'auto'; asked again on each reconnect and every ${REPLICA_LOOKUP_INTERVAL_MS / 1000} s)`,
    );
  }

  private switchOn(why: string): void {
    this.on = true;
    clearInterval(this.timer);
    this.turnOn();
    this.say(why);
  }

  private say(why: string): void {
    this.logger.log(`Lost-write check on: ${why} (failover.detectLostWrites: 'auto')`);
  }
}

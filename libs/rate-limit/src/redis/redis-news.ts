import type { LoggerService } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { LiftedKeysWatcher } from '../store/rate-limit-store.js';
import { withDeadline } from './redis-timeout.js';
import { OPERATION_TIMEOUT_MS } from './script-runner.js';
import { INSTANCE_COUNT_REFRESH_MS } from '../module/defaults.js';
import { isCluster } from './is-cluster.js';

/** What `RedisNews.listen` tells of one channel. */
export interface ChannelListener {
  message(text: string): void;
  /** Whether messages reach this instance from now on (false: some may be missed until it is true again). */
  listening(on: boolean): void;
  /** The warning, said once, when the subscription is refused (an ACL without the channel, say). */
  refused(error: unknown): string;
}

/**
 * News between instances over Redis pub/sub: the keys whose counts an instance lowered (a reset, a
 * refund), so every instance's block cache and leases let them go; and what else a layer listens
 * for (the live config centre's changes). One subscribing connection of its own, opened at the
 * app's start (`start`), for every channel.
 */
export class RedisNews {
  private readonly listeners: { channel: string; listener: ChannelListener }[] = [];
  private readonly refusalsSaid = new Set<ChannelListener>();
  private subscriber: Redis | Cluster | undefined;
  private started = false;
  /** What `watchLiftedKeys` tells, and whether the lifted-keys channel is listened to now. */
  private readonly liftedWatchers: LiftedKeysWatcher[] = [];
  private liftedListening = false;
  /** Instances subscribed to the lifted-keys channel when last counted (`instances`). */
  private counted: number | undefined;
  private counting: NodeJS.Timeout | undefined;
  private countInFlight: Promise<void> | undefined;
  /** Whether a refused count (an ACL without PUBSUB) was said. */
  private countRefusalSaid = false;

  /** @param liftedChannel where instances announce the keys whose counts they lowered. */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly liftedChannel: string,
    private readonly timeoutMs: number,
    private readonly logger: LoggerService,
  ) {}

  /** Tells every instance's watchers (`watchLiftedKeys`) that these keys' counts were lowered. */
  async announceLifted(keys: readonly string[]): Promise<void> {
    if (keys.length === 0) return;
    await this.publish(this.liftedChannel, JSON.stringify(keys));
  }

  /**
   * Tells `watcher` of the keys any instance announces, and whether it is listening: from each
   * confirmed subscription until the connection is lost (announcements made meanwhile are missed).
   * Every watcher (the block cache, leases, the lost-write check) shares one listener of the
   * channel, so a refused subscription is said once.
   */
  watchLiftedKeys(watcher: LiftedKeysWatcher): void {
    this.liftedWatchers.push(watcher);
    // A watcher that comes once the subscription is confirmed learns so at once.
    if (this.liftedListening) watcher.listening(true);
    if (this.liftedWatchers.length > 1) return;
    const listening = (on: boolean) => {
      this.liftedListening = on;
      for (const each of this.liftedWatchers) each.listening(on);
      if (!on) return;
      // Says hello (no keys), so the others count this instance at once, and counts them.
      this.publish(this.liftedChannel, '[]').catch(() => undefined);
      this.countInstances();
    };
    this.listen(this.liftedChannel, {
      message: (text) => {
        let keys: unknown;
        try {
          keys = JSON.parse(text);
        } catch {
          keys = undefined;
        }
        if (!Array.isArray(keys)) {
          listening(true); // Unreadable news: forget every block, and go on listening.
          return;
        }
        if (keys.length === 0) {
          this.countInstances(); // another instance's hello
          return;
        }
        const lifted = keys.filter((key): key is string => typeof key === 'string');
        for (const each of this.liftedWatchers) each.lifted(lifted);
      },
      listening,
      refused: (error) =>
        // An ACL without this channel (NOPERM), say: no block is kept, and every refusal asks Redis.
        `Subscribing to ${this.liftedChannel} failed (${String(error)}); the block cache stays off, every request asks Redis`,
    });
  }

  /**
   * How many instances share this Redis (every one subscribes to the lifted-keys channel), as last
   * counted: undefined until a count succeeds. Counted once subscribed, then every
   * INSTANCE_COUNT_REFRESH_MS. What the local fallback divides a limit by.
   */
  get instances(): number | undefined {
    return this.counted;
  }

  /**
   * Counts the instances now, and every INSTANCE_COUNT_REFRESH_MS from the first count. Off the
   * request path, with an operator's deadline: a Redis that stalls longer than a request's deadline
   * must still be counted on.
   */
  private countInstances(): void {
    if (this.countInFlight) return;
    const nodes = isCluster(this.client) ? this.client.nodes('all') : [this.client];
    this.countInFlight = Promise.all(
      nodes.map((node) =>
        withDeadline(node.pubsub('NUMSUB', this.liftedChannel), OPERATION_TIMEOUT_MS, 'PUBSUB NUMSUB'),
      ),
    )
      .then(
        (counts) => {
          // [channel, subscribers] from each node: on Cluster, each counts the connections it holds.
          const total = counts.reduce((sum: number, reply) => sum + Number((reply as unknown[])[1]), 0);
          if (total > 0) this.counted = total;
        },
        // Kept as last counted (an ACL without PUBSUB: never counted, and the fallback assumes).
        (error: unknown) => {
          if (this.countRefusalSaid || !String(error).includes('NOPERM')) return;
          this.countRefusalSaid = true;
          this.logger.warn(
            `Counting the instances (PUBSUB NUMSUB ${this.liftedChannel}) failed (${String(error)}); the local fallback assumes storeErrors.localFallback.expectedInstances`,
          );
        },
      )
      .finally(() => (this.countInFlight = undefined));
    this.counting ??= setInterval(() => this.countInstances(), INSTANCE_COUNT_REFRESH_MS).unref();
  }

  /**
   * Tells `listener` of every message published on `channel`, and whether it is listening: from
   * each confirmed subscription until the connection is lost. From the app's start, or at once if
   * it has started.
   */
  listen(channel: string, listener: ChannelListener): void {
    this.listeners.push({ channel, listener });
    if (!this.started) return;
    if (!this.subscriber) this.subscribe();
    else if (this.subscriber.status === 'ready') this.subscribeTo(this.subscriber, [{ channel, listener }]);
  }

  /** Publishes a message on a channel, with the call deadline. */
  async publish(channel: string, message: string): Promise<void> {
    await withDeadline(this.client.publish(channel, message), this.timeoutMs, 'PUBLISH');
  }

  /** The app starts: subscribes for the listeners so far. */
  start(): void {
    this.started = true;
    if (this.listeners.length > 0) this.subscribe();
  }

  stop(): void {
    clearInterval(this.counting);
    this.subscriber?.disconnect();
  }

  private subscribe(): void {
    const { client } = this;
    // A connection of its own (a subscribed one takes no other commands). It subscribes on every
    // (re)connect itself, so it knows when each subscription is confirmed.
    const own = { enableOfflineQueue: true, lazyConnect: false, autoResubscribe: false };
    const subscriber = isCluster(client)
      ? client.duplicate(undefined, { ...own, redisOptions: { ...client.options.redisOptions, ...own } })
      : client.duplicate({ ...own, connectionName: 'rate-limit-news' });
    this.subscriber = subscriber;
    subscriber.on('error', () => undefined);
    subscriber.on('close', () => {
      for (const { listener } of this.listeners) listener.listening(false);
    });
    subscriber.on('ready', () => this.subscribeTo(subscriber, this.listeners));
    subscriber.on('message', (channel: string, message: string) => {
      for (const entry of this.listeners) if (entry.channel === channel) entry.listener.message(message);
    });
  }

  private subscribeTo(
    subscriber: Redis | Cluster,
    entries: readonly { channel: string; listener: ChannelListener }[],
  ): void {
    for (const { channel, listener } of entries) {
      subscriber.subscribe(channel).then(
        () => listener.listening(true),
        (error: unknown) => {
          if (this.refusalsSaid.has(listener)) return;
          this.refusalsSaid.add(listener);
          this.logger.warn(listener.refused(error));
        },
      );
    }
  }
}

import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { type KeyAuditReport, auditRateLimitKeys } from '../ops/key-audit.js';
import { type CircuitBreakerState, RedisCircuitBreaker } from './redis-circuit-breaker.js';
import type { RedisScript } from './redis-script.js';
import type { LiftedKeysWatcher } from '../store/rate-limit-store.js';
import { LOG_SAMPLING } from '../module/defaults.js';
import { mastersOf } from './masters.js';
import { CallDeadlines, RedisTimeoutError } from './call-deadlines.js';
import { unsupportedRedis } from './redis-version.js';
import { WriteBatches } from './write-batches.js';
import { isCluster } from './is-cluster.js';
import { REDIS_CONNECTION, type RedisConnection, reconnectDelay } from './redis-connection.js';

export { RedisTimeoutError };

/** How long the app's start waits for Redis before serving without it. */
const BOOTSTRAP_CONNECT_MS = 3_000;

/** The deadline of an operator's call (`runOperation`). */
const OPERATION_TIMEOUT_MS = 2_000;

/** @internal What `RedisService.listen` tells of one channel. */
export interface ChannelListener {
  message(text: string): void;
  /** Whether messages reach this instance from now on (false: some may be missed until it is true again). */
  listening(on: boolean): void;
  /** The warning, said once, when the subscription is refused (an ACL without the channel, say). */
  refused(error: unknown): string;
}

/**
 * The library's Redis connection: its own (created from the module options and closed on shutdown)
 * or one the application supplied (left open). Runs the limiter's Lua scripts with a deadline, and
 * loads them on every (re)connect so that EVALSHA normally hits.
 */
@Injectable()
export class RedisService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly redis: Redis | Cluster | undefined;
  private readonly ownsClient: boolean;
  private readonly timeoutMs: number;
  private readonly deadlines: CallDeadlines;
  private readonly scripts = new Set<RedisScript>();
  private readonly keyPrefix: string;
  private readonly breaker: RedisCircuitBreaker | undefined;
  /** Where instances announce the keys whose counts they lowered (`announceLifted`, `watchLiftedKeys`). */
  private readonly liftedChannel: string;
  private readonly listeners: { channel: string; listener: ChannelListener }[] = [];
  private subscriber: Redis | Cluster | undefined;
  private bootstrapped = false;
  private readonly batches: WriteBatches | undefined;
  private shuttingDown = false;

  /** @internal Nest creates it from the module's options, and the client made from them (`redisConnection`). */
  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) resolved: ResolvedRateLimitOptions,
    @Inject(REDIS_CONNECTION) connection: RedisConnection | null,
  ) {
    this.timeoutMs = resolved.storeErrors.timeoutMs;
    this.deadlines = new CallDeadlines(this.timeoutMs);
    this.keyPrefix = resolved.keyPrefix;
    this.liftedChannel = `${resolved.keyPrefix}:lifted`;
    const { circuitBreaker } = resolved.storeErrors;
    if (circuitBreaker) {
      this.breaker = new RedisCircuitBreaker(circuitBreaker, this.logger, LOG_SAMPLING.intervalMs);
    }
    this.redis = connection?.client;
    this.ownsClient = connection?.owned ?? false;
    if (this.redis) {
      this.batches = new WriteBatches(this.redis, () => this.deadlines.sent());
      this.redis.on('ready', this.onReady);
      // An 'error' event without a listener is printed for every reconnect attempt; the limiter
      // reports failures itself, by sampling, when a request meets them.
      if (this.ownsClient) this.redis.on('error', () => undefined);
      if (this.ownsClient) this.redis.on('end', this.onEnd);
    }
  }

  /** Whether Redis was configured; without it the library runs on its in-process store. */
  get isConfigured(): boolean {
    return this.redis !== undefined;
  }

  /** The ioredis client. Throws when no Redis was configured. */
  get client(): Redis | Cluster {
    if (!this.redis) throw new Error('RateLimitModule: no Redis is configured (options.redis)');
    return this.redis;
  }

  /** Where this service connects, for logs. */
  describe(): string {
    const client = this.client;
    if (!this.ownsClient) return 'application-supplied client';
    if (isCluster(client)) return 'cluster';
    const { host, port, path, sentinels, name } = client.options;
    if (sentinels?.length) return `sentinels ${sentinels.map((s) => `${s.host}:${s.port}`).join(',')} for ${name}`;
    return path ? `unix:${path}` : `${host}:${port}`;
  }

  /** Makes a script known, so it is loaded on every (re)connect (`run` does it for a script it meets first). */
  register(script: RedisScript): void {
    this.scripts.add(script);
    if (this.redis?.status === 'ready') void this.loadScripts([script]);
  }

  /**
   * Runs a script with the configured deadline, through the circuit breaker. A call past its
   * deadline rejects with `RedisTimeoutError` (its late reply, if any, is discarded); while the
   * circuit is open, calls reject at once with `BrokenCircuitError`.
   */
  run(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    // A variant built on first use (`ScriptsByAlgorithms`) is loaded on reconnects from now on.
    if (!this.scripts.has(script)) this.register(script);
    const { breaker } = this;
    if (breaker && !breaker.closed) {
      return breaker.execute(() =>
        this.deadlines.track(script.run(this.client, keys, args), script.name, undefined, this.batches!.hold()),
      );
    }
    const held = this.batches!.hold();
    return this.deadlines.track(script.run(this.client, keys, args), script.name, breaker, held);
  }

  /**
   * @internal
   * Runs an operator's call (a limit written, a counter inspected), off the request path: with a
   * deadline of its own (2 s), not the requests', and past the circuit breaker, so an outage does
   * not hide whether Redis takes it.
   */
  runOperation(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    if (!this.scripts.has(script)) this.register(script);
    return withDeadline(script.run(this.client, keys, args), OPERATION_TIMEOUT_MS, script.name);
  }

  /** @internal An operator's command (`client.hgetall(…)`, say) with `runOperation`'s deadline, or the one given: it never hangs. */
  operation<T>(command: Promise<T>, what: string, timeoutMs = OPERATION_TIMEOUT_MS): Promise<T> {
    return withDeadline(command, timeoutMs, what);
  }

  /**
   * Waits until `replicas` replicas have every write so far on this connection (Redis `WAIT`), at
   * most `timeoutMs`; resolves with how many did. Not for Cluster, where WAIT cannot follow a key.
   */
  async waitForReplicas(replicas: number, timeoutMs: number): Promise<number> {
    const client = this.client;
    if (isCluster(client)) return 0;
    return Number(await withDeadline(client.call('WAIT', replicas, timeoutMs), timeoutMs + this.timeoutMs, 'WAIT'));
  }

  /**
   * @internal
   * Replicas an operator's write must reach before it is confirmed, so a failover cannot lose it:
   * one behind Sentinel (which exists to fail over to one), one when the server reports any
   * connected; none for a lone server. Cluster: none (WAIT cannot follow a key there).
   */
  async replicasToConfirm(): Promise<number> {
    const client = this.client;
    if (isCluster(client)) return 0;
    if (client.options.sentinels?.length) return 1;
    const info = await this.operation(client.info('replication'), 'INFO');
    return Number(/connected_slaves:(\d+)/.exec(info)?.[1] ?? 0) > 0 ? 1 : 0;
  }

  /** @internal Tells every instance's watchers (`watchLiftedKeys`) that these keys' counts were lowered. */
  async announceLifted(keys: readonly string[]): Promise<void> {
    if (keys.length === 0) return;
    await withDeadline(this.client.publish(this.liftedChannel, JSON.stringify(keys)), this.timeoutMs, 'PUBLISH');
  }

  /**
   * @internal
   * Tells `watcher` of the keys any instance announces, over a connection of its own subscribed from
   * the app's start, and whether it is listening: from each confirmed subscription until that
   * connection is lost (announcements made meanwhile are missed).
   */
  watchLiftedKeys(watcher: LiftedKeysWatcher): void {
    this.listen(this.liftedChannel, {
      message: (text) => {
        let keys: unknown;
        try {
          keys = JSON.parse(text);
        } catch {
          keys = undefined;
        }
        if (Array.isArray(keys)) watcher.lifted(keys.filter((key): key is string => typeof key === 'string'));
        else watcher.listening(true); // Unreadable news: forget every block, and go on listening.
      },
      listening: (on) => watcher.listening(on),
      refused: (error) =>
        // An ACL without this channel (NOPERM), say: no block is kept, and every refusal asks Redis.
        `Subscribing to ${this.liftedChannel} failed (${String(error)}); the block cache stays off, every request asks Redis`,
    });
  }

  /**
   * @internal
   * Tells `listener` of every message published on `channel`, over the one connection of this
   * service that subscribes (from the app's start, or at once if it has started), and whether it is
   * listening: from each confirmed subscription until that connection is lost.
   */
  listen(channel: string, listener: ChannelListener): void {
    this.listeners.push({ channel, listener });
    if (!this.bootstrapped || !this.redis) return;
    if (!this.subscriber) this.subscribe(this.redis);
    else if (this.subscriber.status === 'ready') this.subscribeTo(this.subscriber, [{ channel, listener }]);
  }

  /** @internal Publishes a message on a channel, with the call deadline. */
  async publish(channel: string, message: string): Promise<void> {
    await withDeadline(this.client.publish(channel, message), this.timeoutMs, 'PUBLISH');
  }

  /** Whether Redis answers a PING within the call deadline (every master of a Cluster). */
  async reachable(): Promise<boolean> {
    if (!this.redis) return false;
    const nodes = mastersOf(this.redis);
    if (nodes.length === 0) return false;
    try {
      await Promise.all(nodes.map((node) => withDeadline(node.ping(), this.timeoutMs, 'PING')));
      return true;
    } catch {
      return false;
    }
  }

  /** @internal Whether every script registered so far is cached on every master (SCRIPT EXISTS). */
  async scriptsLoaded(): Promise<boolean> {
    const client = this.client;
    const shas = [...this.scripts].map((script) => script.sha);
    if (shas.length === 0) return true;
    const answers = await Promise.all(
      mastersOf(client).map((node) =>
        withDeadline(node.script('EXISTS', ...shas) as Promise<number[]>, this.timeoutMs, 'SCRIPT EXISTS'),
      ),
    );
    return answers.every((exists) => exists.every((one) => one === 1));
  }

  /** The circuit breaker's state: `'open'` while calls to Redis are suspended. */
  get circuitState(): CircuitBreakerState {
    return this.breaker?.state ?? 'closed';
  }

  /**
   * Scans the library's keys on every master and reports those without a TTL; with `repairTtlMs`,
   * gives them that TTL. For monitoring; `npm run audit:keys` runs the same from a shell.
   */
  auditKeys(options: { repairTtlMs?: number; scanCount?: number; maxListed?: number } = {}): Promise<KeyAuditReport> {
    return auditRateLimitKeys(this.client, { keyPrefix: this.keyPrefix, ...options });
  }

  /** Connects once every module is initialised, so an app whose bootstrap fails leaves no socket open. */
  async onApplicationBootstrap(): Promise<void> {
    this.bootstrapped = true;
    if (!this.redis) return;
    if (this.listeners.length > 0) this.subscribe(this.redis);
    if (this.ownsClient && this.redis.status === 'wait') {
      // connect() settles only once the server answers; a paused server, or sentinels that are all
      // down, would hold the app's start for ever. Wait a bounded time, then serve by the store-error policies.
      const connecting = this.redis.connect();
      connecting.catch(() => undefined);
      try {
        await withDeadline(connecting, BOOTSTRAP_CONNECT_MS, 'the connection');
      } catch (error) {
        // Not fatal: the client keeps reconnecting, and until it is back requests follow the store-error policies.
        this.logger.error(`Redis (${this.describe()}) is not reachable yet: ${String(error)}`);
        return;
      }
    }
    // Before the first request: loads the scripts and, on Cluster, opens the connection to every
    // master (a first command on a node not yet connected waits out a 100 ms retry).
    if (this.redis.status === 'ready') {
      await withDeadline(this.loadScripts(), 2_000, 'SCRIPT LOAD').catch(() => undefined);
      await withDeadline(this.checkVersion(), 2_000, 'INFO').catch(() => undefined);
    }
  }

  async onApplicationShutdown(): Promise<void> {
    this.shuttingDown = true;
    this.breaker?.close();
    this.subscriber?.disconnect();
    const client = this.redis;
    client?.off('ready', this.onReady);
    if (!client || !this.ownsClient || client.status === 'end') return;
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

  private readonly readyListeners: (() => void)[] = [];

  /**
   * A client of ours ends only when the app shuts down: ioredis ends a Sentinel client for good when
   * `+switch-master` arrives while it is reconnecting to the master that failed (its failover
   * detector closes the connector in the middle of asking the sentinels). Every request would then
   * go to the store-error policy until a restart (`test/integration/failover-loss.spec.ts` met it on
   * a busy machine). Connect again, as a reconnect would.
   */
  private readonly onEnd = () => {
    const client = this.redis;
    if (!client || this.shuttingDown) return;
    setTimeout(() => {
      if (!this.shuttingDown && client.status === 'end') client.connect().catch(() => undefined);
    }, reconnectDelay(1)).unref();
  };

  private readonly onReady = () => {
    void this.loadScripts();
    for (const listener of this.readyListeners) listener();
  };

  /** @internal Calls `listener` each time the connection is (re)established and ready for commands. */
  whenReady(listener: () => void): void {
    this.readyListeners.push(listener);
  }

  private subscribe(client: Redis | Cluster): void {
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

  private readonly refusalsSaid = new Set<ChannelListener>();

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

  /** Says at the start, once, when a server is too old for the scripts, rather than by every request's error. */
  private async checkVersion(): Promise<void> {
    const client = this.client;
    for (const node of mastersOf(client)) {
      const problem = unsupportedRedis(await node.info('server'));
      if (problem) {
        const where = isCluster(client) ? `${node.options.host}:${node.options.port}` : this.describe();
        this.logger.error(
          `Redis (${where}) ${problem}; until it is upgraded, requests follow the store-error policies`,
        );
        return;
      }
    }
  }

  private async loadScripts(scripts: Iterable<RedisScript> = this.scripts): Promise<void> {
    const client = this.redis;
    if (!client) return;
    try {
      await Promise.all(
        mastersOf(client).flatMap((node) => [...scripts].map((script) => node.script('LOAD', script.source))),
      );
    } catch (error) {
      // EVALSHA falls back to EVAL on NOSCRIPT, so a failed preload only costs one extra round trip.
      this.logger.debug(`Preloading Lua scripts failed: ${String(error)}`);
    }
  }
}

/**
 * Rejects with `RedisTimeoutError` when `promise` has not settled `ms` after the call, as Redis sees
 * it, not as a stalled event loop sees it (the verdict waits for `setImmediate`, as `CallDeadlines`
 * explains). For the calls off the request path: connecting, WAIT, QUIT.
 */
function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      setImmediate(() => {
        if (settled) return;
        settled = true;
        reject(new RedisTimeoutError(`Redis did not answer ${what} within ${ms} ms`));
      });
    }, ms);
    promise.then(
      (value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import type { RedisScript } from './script-runner.js';
import type { LiftedKeysWatcher } from '../store/rate-limit-store.js';
import { LOG_SAMPLING } from '../module/defaults.js';
import { mastersOf } from './masters.js';
import { type CircuitBreakerState, RedisCircuitBreaker, RedisTimeoutError, withDeadline } from './call-safety.js';
import { type KeyAuditReport, auditRateLimitKeys } from './key-audit.js';
import { LateAnswers } from './late-answers.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { ACCESS_PROBE_SCRIPT } from './scripts/access-probe.script.js';
import { RedisMemory, type RedisMemoryState } from './redis-memory.js';
import { unsupportedRedis } from './redis-version.js';
import { isCluster } from './is-cluster.js';
import { REDIS_CONNECTION, type RedisConnection, reconnectDelay } from './redis-connection.js';
import { type ChannelListener, RedisNews } from './redis-news.js';
import { OPERATION_TIMEOUT_MS, ScriptRunner } from './script-runner.js';

export { RedisTimeoutError };
export type { ChannelListener };

/** How long the app's start waits for Redis before serving without it. */
const BOOTSTRAP_CONNECT_MS = 3_000;

/**
 * The library's Redis connection: its own (made from the module options by `redis-connection.ts`,
 * connected when the app starts and closed when it stops) or one the application supplied (left
 * open). The scripts run through its `ScriptRunner` (deadline, breaker, one write per turn), and
 * news between instances goes through its `RedisNews` (pub/sub).
 */
@Injectable()
export class RedisService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly redis: Redis | Cluster | undefined;
  private readonly ownsClient: boolean;
  private readonly timeoutMs: number;
  private readonly keyPrefix: string;
  private readonly breaker: RedisCircuitBreaker | undefined;
  private readonly lateAnswers: LateAnswers;
  private memory: RedisMemory | undefined;
  /** The client's last error event: why a connection failed (a certificate refused, a password). */
  private connectionError: Error | undefined;
  private readonly runner: ScriptRunner | undefined;
  private readonly news: RedisNews | undefined;
  private readonly readyListeners: (() => void)[] = [];
  private shuttingDown = false;

  /** @internal Nest creates it from the module's options, and the client made from them (`redisConnection`). */
  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) resolved: ResolvedRateLimitOptions,
    @Inject(REDIS_CONNECTION) connection: RedisConnection | null,
    /** The app's rules: with any, an ACL that refuses what they need stops the app at its start. */
    @Optional() @Inject(RateLimitRuleRegistry) private readonly rules: RateLimitRuleRegistry | null = null,
  ) {
    this.timeoutMs = resolved.storeErrors.timeoutMs;
    this.keyPrefix = resolved.keyPrefix;
    const { circuitBreaker } = resolved.storeErrors;
    if (circuitBreaker) {
      this.breaker = new RedisCircuitBreaker(circuitBreaker, this.logger, LOG_SAMPLING.intervalMs);
    }
    this.lateAnswers = new LateAnswers(this.breaker);
    this.redis = connection?.client;
    this.ownsClient = connection?.owned ?? false;
    if (this.redis) {
      this.runner = new ScriptRunner(this.redis, this.timeoutMs, this.breaker, this.lateAnswers, this.logger);
      this.news = new RedisNews(this.redis, `${resolved.keyPrefix}:lifted`, this.timeoutMs, this.logger);
      this.memory = new RedisMemory(this.redis, this.logger, () => this.describe());
      this.redis.on('ready', this.onReady);
      // An 'error' event without a listener is printed for every reconnect attempt; the limiter
      // reports failures itself, by sampling, when a request meets them.
      if (this.ownsClient) this.redis.on('error', (error: Error) => (this.connectionError = error));
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
    this.scriptRunner.register(script);
  }

  /**
   * Runs a script with the configured deadline, through the circuit breaker. A call past its
   * deadline rejects with `RedisTimeoutError`, which holds the call for its late answer
   * (`LateAnswers`); while the circuit is open, calls reject at once with `BrokenCircuitError`.
   */
  run(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return this.scriptRunner.run(script, keys, args);
  }

  /**
   * @internal
   * Runs an operator's call (a limit written, a counter inspected), off the request path: with a
   * deadline of its own (2 s), not the requests', and past the circuit breaker, so an outage does
   * not hide whether Redis takes it.
   */
  runOperation(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return this.scriptRunner.runOperation(script, keys, args);
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
  announceLifted(keys: readonly string[]): Promise<void> {
    return this.redisNews.announceLifted(keys);
  }

  /** @internal How many instances share this Redis, as last counted (`RedisNews.instances`); undefined until known. */
  get instances(): number | undefined {
    return this.news?.instances;
  }

  /** @internal Tells `watcher` of the keys any instance lowered, and whether that news reaches this one (`RedisNews`). */
  watchLiftedKeys(watcher: LiftedKeysWatcher): void {
    this.news?.watchLiftedKeys(watcher);
  }

  /** @internal Tells `listener` of every message published on `channel` (`RedisNews`). */
  listen(channel: string, listener: ChannelListener): void {
    this.news?.listen(channel, listener);
  }

  /** @internal Publishes a message on a channel, with the call deadline. */
  publish(channel: string, message: string): Promise<void> {
    return this.redisNews.publish(channel, message);
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

  /**
   * @internal Redis's `maxmemory`, its policy, and whether it evicted keys since the last call, each
   * master within `timeoutMs`; warns of an evicting policy, once (`RedisMemory`).
   */
  memoryState(timeoutMs = this.timeoutMs): Promise<RedisMemoryState> {
    return this.memory!.check((call) => withDeadline(call, timeoutMs, 'INFO memory'));
  }

  /** @internal Whether every script registered so far is cached on every master (SCRIPT EXISTS). */
  scriptsLoaded(): Promise<boolean> {
    return this.scriptRunner.loaded();
  }

  /** The circuit breaker's state: `'open'` while calls to Redis are suspended. */
  get circuitState(): CircuitBreakerState {
    return this.breaker?.state ?? 'closed';
  }

  /**
   * Calls past their deadline, as judged (`LateAnswers`): `answered` late (a slow Redis), or
   * `unanswered` a second later (failures for the circuit breaker).
   */
  get lateCalls(): { answered: number; unanswered: number } {
    return { ...this.lateAnswers.counts };
  }

  /** @internal Whether Redis seems down rather than slow (`LateAnswers.redisSeemsDown`): for the local fallback. */
  get seemsDown(): boolean {
    return this.lateAnswers.redisSeemsDown;
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
    if (!this.redis) return;
    this.news!.start();
    if (this.ownsClient && this.redis.status === 'wait') {
      // connect() settles only once the server answers; a paused server, or sentinels that are all
      // down, would hold the app's start for ever. Wait a bounded time, then serve by the store-error policies.
      const connecting = this.redis.connect();
      connecting.catch(() => undefined);
      try {
        await withDeadline(connecting, BOOTSTRAP_CONNECT_MS, 'the connection');
      } catch (error) {
        // Not fatal: the client keeps reconnecting, and until it is back requests follow the store-error policies.
        // ioredis rejects a failed connect with 'Connection is closed'; its error event says why.
        const why = this.connectionError ?? error;
        this.logger.error(`Redis (${this.describe()}) is not reachable yet: ${String(why)}`);
        return;
      }
    }
    // Before the first request: loads the scripts and, on Cluster, opens the connection to every
    // master (a first command on a node not yet connected waits out a 100 ms retry).
    if (this.redis.status === 'ready') {
      await withDeadline(this.runner!.load(), 2_000, 'SCRIPT LOAD').catch(() => undefined);
      await withDeadline(this.checkVersion(), 2_000, 'INFO').catch(() => undefined);
      // Warns of a Redis that evicts keys when full (once), and notes its evictions so far.
      await this.memoryState(2_000).catch(() => undefined);
      await this.checkAccess();
    }
  }

  async onApplicationShutdown(): Promise<void> {
    this.shuttingDown = true;
    this.breaker?.close();
    this.news?.stop();
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
    void this.runner!.load();
    for (const listener of this.readyListeners) listener();
  };

  /** @internal Calls `listener` each time the connection is (re)established and ready for commands. */
  whenReady(listener: () => void): void {
    this.readyListeners.push(listener);
  }

  /**
   * Runs every command of the scripts once (`ACCESS_PROBE_SCRIPT`) and names those the Redis user
   * may not run (an ACL without one, or without the keys or the channel): the app stops here,
   * rather than each request meeting the refusal, under load. Only in an app that declares rules: an
   * operator's tool (the CLI, run by a read-only user perhaps) runs what its user may.
   */
  private async checkAccess(): Promise<void> {
    if ((this.rules?.all().length ?? 0) === 0) return;
    const at = `${this.keyPrefix}:{access-probe}`;
    const refused = await this.runner!.runOperation(
      ACCESS_PROBE_SCRIPT,
      [`${at}:s`, `${at}:h`, `${at}:z`],
      [`${this.keyPrefix}:lifted`],
    ).then(
      (reply) => (reply as unknown[]).map(String),
      // Refused whole (no EVALSHA, no keys); anything else (a timeout) tells nothing of the ACL.
      (error: unknown) => (String(error).includes('NOPERM') ? [String(error)] : []),
    );
    if (refused.length === 0) return;
    const message =
      `RateLimitModule: Redis (${this.describe()}) refuses what the rate limiter runs: ${[...new Set(refused)].join('; ')}. ` +
      'Grant the ACL in the docs (operations.md, "A least-privilege Redis user")';
    // The app does not start: nor does it leave its connections open.
    this.news?.stop();
    if (this.ownsClient) this.redis!.disconnect();
    throw new Error(message);
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

  /** @internal What runs the scripts (the store's calls go to it directly). Throws when no Redis was configured. */
  get scripts(): ScriptRunner {
    return this.scriptRunner;
  }

  private get scriptRunner(): ScriptRunner {
    if (!this.runner) throw new Error('RateLimitModule: no Redis is configured (options.redis)');
    return this.runner;
  }

  private get redisNews(): RedisNews {
    if (!this.news) throw new Error('RateLimitModule: no Redis is configured (options.redis)');
    return this.news;
  }
}

import { Inject, Injectable, Logger, type OnApplicationBootstrap, type OnApplicationShutdown } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { withDeadline } from './redis-timeout.js';
import { ConnectionLife } from './connection-life.js';
import { REDIS_CONNECTION, type RedisConnection } from './redis-connection.js';
import { RedisMemory } from './redis-memory.js';
import { RedisNews } from './redis-news.js';
import type { RedisScript } from './script-runner.js';
import { Replicas } from './replicas.js';
import { ScriptRunner } from './script-runner.js';
import { checkAccess, checkVersion } from './start-checks.js';

/** The parts of a configured Redis: each with one job. */
interface RedisParts {
  readonly connection: ConnectionLife;
  readonly runner: ScriptRunner;
  readonly news: RedisNews;
  readonly replicas: Replicas;
  readonly memory: RedisMemory;
}

/**
 * The library's Redis connection: its own (made from the module options by `redis-connection.ts`,
 * connected when the app starts and closed when it stops) or one the application supplied (left
 * open). Every script runs through it (`run`, and the library's own calls through its runner).
 *
 * A facade over parts with one job each, which the library uses directly: the connection's life
 * (`ConnectionLife`), the runner of scripts and commands (`ScriptRunner`: deadline, breaker, one
 * write per turn), news between instances (`RedisNews`, pub/sub), the replicas a write waits for
 * (`Replicas`), and Redis's memory (`RedisMemory`).
 */
@Injectable()
export class RedisService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly redis: Redis | Cluster | undefined;
  private readonly parts: RedisParts | undefined;
  private readonly timeoutMs: number;
  private readonly keyPrefix: string;
  private readonly checksAccess: (() => boolean) | undefined;

  /**
   * @internal Nest creates it from the module's options, the client made from them
   * (`redisConnection`), with whether the app's start checks the Redis user's access.
   */
  constructor(
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) resolved: ResolvedRateLimitOptions,
    @Inject(REDIS_CONNECTION) connection: RedisConnection | null,
  ) {
    this.timeoutMs = resolved.storeErrors.timeoutMs;
    this.keyPrefix = resolved.keyPrefix;
    this.redis = connection?.client;
    this.checksAccess = connection?.checksAccess;
    if (!connection) return;
    const { client, owned } = connection;
    const life = new ConnectionLife(client, owned, this.logger);
    const runner = new ScriptRunner(
      client,
      this.timeoutMs,
      resolved.storeErrors.circuitBreaker || undefined,
      this.logger,
    );
    this.parts = {
      connection: life,
      runner,
      news: new RedisNews(client, `${resolved.keyPrefix}:lifted`, this.timeoutMs, this.logger),
      replicas: new Replicas(client, runner, this.timeoutMs),
      memory: new RedisMemory(client, this.timeoutMs, this.logger, () => life.describe()),
    };
    // Before anyone else hears of a (re)connect: the scripts are loaded again.
    life.whenReady(() => void runner.load());
  }

  /** Whether Redis was configured; without it the library runs on its in-process store. */
  get isConfigured(): boolean {
    return this.redis !== undefined;
  }

  /** The ioredis client, for the app's own commands. Throws when no Redis was configured. */
  get client(): Redis | Cluster {
    if (!this.redis) throw notConfigured();
    return this.redis;
  }

  /** Where this service connects, for logs. */
  describe(): string {
    return this.configured.connection.describe();
  }

  /**
   * Runs a script with the configured deadline, through the circuit breaker. A call past its
   * deadline rejects with `RedisTimeoutError`, which holds the call for its late answer; while the
   * circuit is open, calls reject at once with `BrokenCircuitError`.
   */
  run(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return this.configured.runner.run(script, keys, args);
  }

  /** Whether Redis answers a PING within the call deadline (every master of a Cluster). */
  async reachable(): Promise<boolean> {
    return this.parts ? this.parts.connection.reachable(this.timeoutMs) : false;
  }

  /** @internal The connection's life: `whenReady`, for who must act on each (re)connect. Throws when no Redis was configured. */
  get connection(): ConnectionLife {
    return this.configured.connection;
  }

  /**
   * @internal What runs the scripts and the operators' commands (with their deadlines, the
   * breaker), and tells the breaker's state and the calls past their deadline. Throws when no Redis
   * was configured.
   */
  get runner(): ScriptRunner {
    return this.configured.runner;
  }

  /** @internal News between instances over pub/sub: lifted keys, the instances counted, channels. Throws when no Redis was configured. */
  get news(): RedisNews {
    return this.configured.news;
  }

  /** @internal The replicas an operator's write waits for. Throws when no Redis was configured. */
  get replicas(): Replicas {
    return this.configured.replicas;
  }

  /** @internal Redis's memory settings and evictions, for the health check. Throws when no Redis was configured. */
  get memory(): RedisMemory {
    return this.configured.memory;
  }

  /** Connects once every module is initialised, so an app whose bootstrap fails leaves no socket open. */
  async onApplicationBootstrap(): Promise<void> {
    const { parts, redis } = this;
    if (!parts || !redis) return;
    parts.news.start();
    if (!(await parts.connection.connect())) return;
    // Before the first request: loads the scripts and, on Cluster, opens the connection to every
    // master (a first command on a node not yet connected waits out a 100 ms retry).
    const describe = () => parts.connection.describe();
    await withDeadline(parts.runner.load(), 2_000, 'SCRIPT LOAD').catch(() => undefined);
    await withDeadline(checkVersion(redis, describe, this.logger), 2_000, 'INFO').catch(() => undefined);
    // Warns of a Redis that evicts keys when full (once), and notes its evictions so far.
    await parts.memory.check(2_000).catch(() => undefined);
    if (!this.checksAccess?.()) return;
    const refusal = await checkAccess(parts.runner, this.keyPrefix, describe);
    if (refusal === undefined) return;
    // The app does not start: nor does it leave its connections open.
    parts.news.stop();
    parts.connection.disconnect();
    throw new Error(refusal);
  }

  async onApplicationShutdown(): Promise<void> {
    if (!this.parts) return;
    this.parts.runner.close();
    this.parts.news.stop();
    await this.parts.connection.close();
  }

  private get configured(): RedisParts {
    if (!this.parts) throw notConfigured();
    return this.parts;
  }
}

function notConfigured(): Error {
  return new Error('RateLimitModule: no Redis is configured (options.redis)');
}

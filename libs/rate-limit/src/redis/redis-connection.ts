import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { RateLimitRedisOptions } from '../module/options.js';
import { describeError } from '../logging/describe-error.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import { type IoredisConnectors, guardedConnector } from './guarded-connector.js';

/** @internal The token of the library's Redis client, made from the `redis` option (null without one). */
export const REDIS_CONNECTION = Symbol('RATE_LIMIT_REDIS_CONNECTION');

/** @internal The client `RedisService` uses, and whether the library made it (and so closes it). */
export interface RedisConnection {
  readonly client: Redis | Cluster;
  readonly owned: boolean;
  /** Whether the app's start checks the Redis user's access (`checkAccess`), asked at the start; without it, no check. */
  readonly checksAccess?: () => boolean;
}

/**
 * @internal The `redis` option given without ioredis installed: the module wiring tells it as a
 * mistake of the options (`RateLimitConfigurationError`).
 */
export class IoredisNotInstalledError extends Error {
  override readonly name = 'IoredisNotInstalledError';

  constructor() {
    super("RateLimitModule options: 'redis' needs the package ioredis: npm install ioredis");
  }
}

/**
 * Reconnect every 50 ms more per attempt, never waiting more than half a second (plus jitter, so
 * instances do not reconnect in step). ioredis's default doubles up to 5 s, which kept clients off
 * a freshly promoted master for seconds; a limiter must be back on Redis as soon as it can be.
 */
export const reconnectDelay = (attempt: number): number => Math.min(attempt * 50, 500) + Math.floor(Math.random() * 50);

/**
 * Defaults for a client the library creates. No offline queue: a call made while the connection is
 * down fails at once instead of waiting. No re-sending of calls that were sent but not answered
 * when a connection dropped: Redis may have run them already, and a request must not count twice.
 */
const OWN_CLIENT_DEFAULTS: RedisOptions = {
  retryStrategy: reconnectDelay,
  lazyConnect: true,
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  // Sentinel: subscribe to +switch-master and reconnect to the new master as soon as it is named,
  // instead of writing to the old one until it is demoted.
  failoverDetector: true,
  // A master demoted to replica answers READONLY: reconnect, and so ask the sentinels again.
  reconnectOnError: (error) => error.message.startsWith('READONLY'),
  maxRetriesPerRequest: 1,
  connectTimeout: 2_000,
  connectionName: 'rate-limit',
};

/**
 * @internal
 * The client for the `redis` option: the app's own (`{ client }`), or one made here, not yet
 * connected (`RedisService` connects it when the app starts). ioredis is loaded only here, and only
 * when the library makes a client: an app on the embedded store runs without it installed. Every
 * socket of the client, its duplicates and its Cluster nodes keeps an error listener
 * (`guardedConnector`): an error ioredis no longer listens for goes to the store's problem log, by
 * its code, not to the process as an uncaught exception.
 */
export async function redisConnection(
  given: RateLimitRedisOptions | undefined,
  problems?: Pick<StoreProblemLog, 'report'>,
): Promise<RedisConnection | null> {
  if (given === undefined) return null;
  if (typeof given === 'object' && 'client' in given) return { client: given.client, owned: false };
  let ioredis: Pick<typeof import('ioredis'), 'Cluster' | 'Redis'>;
  let connectors: IoredisConnectors;
  try {
    ioredis = await import('ioredis');
    connectors = await import('ioredis/built/connectors/index.js');
  } catch (error) {
    // Not installed; anything else (a broken install, say) is told as it is.
    if ((error as { code?: unknown }).code !== 'ERR_MODULE_NOT_FOUND') throw error;
    throw new IoredisNotInstalledError();
  }
  const { Cluster, Redis } = ioredis;
  const onSocketError = (error: Error) => {
    const code = (error as { code?: unknown }).code ?? error.name;
    problems?.report(`socket:${String(code)}`, `Redis connection error: ${describeError(error)}`);
  };
  const defaults: RedisOptions = { ...OWN_CLIENT_DEFAULTS, Connector: guardedConnector(connectors, onSocketError) };
  if (typeof given === 'string') return { client: new Redis(given, defaults), owned: true };
  if ('cluster' in given) {
    const { lazyConnect, enableOfflineQueue, retryStrategy, ...perNode } = defaults;
    const client = new Cluster(given.cluster, {
      lazyConnect,
      enableOfflineQueue,
      clusterRetryStrategy: retryStrategy,
      ...given.options,
      redisOptions: { ...perNode, ...given.options?.redisOptions },
    });
    return { client, owned: true };
  }
  const { url, ...redisOptions } = given;
  const merged = { ...defaults, ...redisOptions };
  return { client: url === undefined ? new Redis(merged) : new Redis(url, merged), owned: true };
}

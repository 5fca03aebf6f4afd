import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll } from 'vitest';
import type { RateLimitModuleOptions, RateLimiterService } from 'nest-rate-limit';
import { type RedisServer, startRedisServer } from './redis-server.js';
import { createStore } from './store-module.js';
import { uniquePrefix } from './test-app.js';

/**
 * For a suite of app instances sharing one Redis: starts a `redis-server` before the suite and
 * stops it after; `instances` builds the module that many times on it, closed after each test.
 * Call it inside `describe`.
 */
export function sharedRedisSuite() {
  let server: RedisServer | undefined;
  let redis: Redis | undefined;
  const closers: (() => Promise<void>)[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
  });

  afterEach(async () => {
    await Promise.all(closers.splice(0).map((close) => close()));
  });

  afterAll(async () => {
    await server?.stop();
  });

  return {
    /** A client of the suite's server (closed with it). */
    get redis(): Redis {
      return redis!;
    },
    get server(): RedisServer {
      return server!;
    },
    /** `count` instances of the module on the suite's Redis, with one key prefix (a fresh one by default). */
    async instances(count: number, options: RateLimitModuleOptions = {}) {
      const keyPrefix = options.keyPrefix ?? uniquePrefix();
      const stores = await Promise.all(
        Array.from({ length: count }, () => createStore({ redis: server!.url, keyPrefix, ...options })),
      );
      closers.push(...stores.map(({ close }) => close));
      return { keyPrefix, stores, limiters: stores.map(({ limiter }): RateLimiterService => limiter) };
    },
    /** Closes `close` after the test, with the instances. */
    closeAfter(close: () => Promise<void>): void {
      closers.push(close);
    },
  };
}

/** Calls of the library's scripts that reached Redis since the last `CONFIG RESETSTAT`. */
export async function scriptCalls(redis: Redis): Promise<number> {
  const info = await redis.info('commandstats');
  const calls = (name: string) => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
  return calls('evalsha') + calls('eval');
}

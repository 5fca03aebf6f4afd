import { afterAll, describe } from 'vitest';
import { type RedisServer, startRedisServer } from './redis-server.js';

/**
 * The store x platform matrix the suites run over. Redis is started on first use, once per test
 * file (each file runs in a process of its own), shared by every case of the file that uses it, and
 * stopped after the file's last test: the hook below belongs to the file that imports this module.
 */

export type Platform = 'express' | 'fastify';
export const PLATFORMS: readonly Platform[] = ['express', 'fastify'];

let starting: Promise<RedisServer> | undefined;

/** This file's Redis, started on the first call. Keys of different cases stay apart by `uniquePrefix()`. */
export function sharedRedis(): Promise<RedisServer> {
  starting ??= startRedisServer().catch((error: unknown) => {
    starting = undefined;
    throw error;
  });
  return starting;
}

afterAll(async () => {
  const server = starting;
  starting = undefined;
  await (await server?.catch(() => undefined))?.stop();
});

export interface StoreCase {
  readonly name: 'memory' | 'Redis';
  /** The module's `redis` option for this store: the file's Redis URL, or undefined (the embedded store). */
  redis(): Promise<string | undefined>;
}

export const STORES: readonly StoreCase[] = [
  { name: 'memory', redis: () => Promise.resolve(undefined) },
  { name: 'Redis', redis: async () => (await sharedRedis()).url },
];

/** `describe(title)` once per store, titled `<title>: <store> store`. */
export function describeStores(title: string, body: (store: StoreCase) => void): void {
  describe.each(STORES.map((store) => [`${title}: ${store.name} store`, store] as const))('%s', (_, store) =>
    body(store),
  );
}

/** `describe(title)` once per HTTP adapter, titled `<title> (<platform>)`. */
export function describePlatforms(title: string, body: (platform: Platform) => void): void {
  describe.each(PLATFORMS.map((platform) => [`${title} (${platform})`, platform] as const))('%s', (_, platform) =>
    body(platform),
  );
}

/** `describe(title)` once per store and HTTP adapter, titled `<title>: <store> store, <platform>`. */
export function describeStoresAndPlatforms(title: string, body: (store: StoreCase, platform: Platform) => void): void {
  const cases = STORES.flatMap((store) =>
    PLATFORMS.map((platform) => [`${title}: ${store.name} store, ${platform}`, store, platform] as const),
  );
  describe.each(cases)('%s', (_, store, platform) => body(store, platform));
}

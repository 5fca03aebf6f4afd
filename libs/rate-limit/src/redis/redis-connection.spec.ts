import { Cluster, Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { isCluster } from './is-cluster.js';
import { redisConnection } from './redis-connection.js';

/** Clients made here connect lazily: none of them opens a socket, and each is closed after its test. */
const made: (Redis | Cluster)[] = [];
afterEach(() => {
  for (const client of made.splice(0)) client.disconnect();
});

describe('redisConnection', () => {
  it('makes no client without the redis option', async () => {
    expect(await redisConnection(undefined)).toBeNull();
  });

  it('takes the app’s own client as it is, and does not own it', async () => {
    const client = new Redis({ lazyConnect: true });
    made.push(client);
    expect(await redisConnection({ client })).toEqual({ client, owned: false });
  });

  it('makes a client of its own from a URL, options or cluster nodes: lazy, with no offline queue', async () => {
    const fromUrl = (await redisConnection('redis://127.0.0.1:6390/2'))!;
    const fromOptions = (await redisConnection({ host: '127.0.0.1', port: 6391, connectTimeout: 500 }))!;
    const fromNodes = (await redisConnection({ cluster: [{ host: '127.0.0.1', port: 6392 }] }))!;
    made.push(fromUrl.client, fromOptions.client, fromNodes.client);
    expect([fromUrl.owned, fromOptions.owned, fromNodes.owned]).toEqual([true, true, true]);
    expect(fromUrl.client).toBeInstanceOf(Redis);
    expect(fromNodes.client).toBeInstanceOf(Cluster);
    const url = fromUrl.client as Redis;
    expect([url.options.port, url.options.db, url.options.lazyConnect, url.options.enableOfflineQueue]).toEqual([
      6390,
      2,
      true,
      false,
    ]);
    // The app's options win over the library's defaults.
    expect((fromOptions.client as Redis).options.connectTimeout).toBe(500);
    expect((fromNodes.client as Cluster).options.redisOptions?.autoResendUnfulfilledCommands).toBe(false);
  });
});

describe('isCluster', () => {
  it('tells a Cluster from a Redis by the mark ioredis sets, without instanceof', () => {
    const redis = new Redis({ lazyConnect: true });
    const cluster = new Cluster([{ host: '127.0.0.1', port: 6392 }], { lazyConnect: true });
    made.push(redis, cluster);
    expect([isCluster(redis), isCluster(cluster)]).toEqual([false, true]);
  });
});

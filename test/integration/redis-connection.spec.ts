import { type Server, type Socket, connect, createServer } from 'node:net';
import { once } from 'node:events';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitStore, RedisService } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/** A loopback TCP proxy to Redis that can drop the connection just as a script's reply comes back. */
class DroppingProxy {
  private readonly server: Server;
  private dropNextArrayReply = false;

  constructor(redisPort: number) {
    this.server = createServer((client: Socket) => {
      const upstream = connect(redisPort, '127.0.0.1');
      client.on('data', (data) => upstream.write(data));
      upstream.on('data', (data) => {
        // The consume script's reply for one rule: an array of five (possibly sharing a chunk with others).
        if (this.dropNextArrayReply && data.includes('*5\r\n')) {
          this.dropNextArrayReply = false;
          client.destroy();
          upstream.destroy();
          return;
        }
        client.write(data);
      });
      for (const socket of [client, upstream]) socket.on('error', () => undefined);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
  }

  async listen(): Promise<number> {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return (this.server.address() as { port: number }).port;
  }

  dropNextReply(): void {
    this.dropNextArrayReply = true;
  }

  close(): void {
    this.server.close();
  }
}

describe('the library’s own Redis connection', () => {
  let server: RedisServer;
  let redis: Redis;
  let proxy: DroppingProxy;
  let store: RateLimitStore;
  let service: RedisService;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    proxy = new DroppingProxy(server.port);
    const port = await proxy.listen();
    ({
      store,
      redis: service,
      close,
    } = await createStore({ redis: `redis://127.0.0.1:${port}`, redisTimeoutMs: 1_000 }));
  });

  afterAll(async () => {
    await close?.();
    proxy?.close();
    await server?.stop();
  });

  it('never re-sends a call whose reply was lost with the connection, so a request is counted once', async () => {
    const key = `${uniquePrefix()}:lost-reply`;
    const limits = { limit: 100, windowMs: 60_000 };

    proxy.dropNextReply();
    await expect(store.consume([hit(key, limits)])).rejects.toThrow();
    // Redis ran the call before its reply was lost.
    expect(await redis.hget(key, 'c')).toBe('1');

    if (service.client.status !== 'ready') await once(service.client, 'ready');
    const next = await store.consume([hit(key, limits)]);
    expect(next.decisions[0].remaining).toBe(98);
    expect(await redis.hget(key, 'c')).toBe('2');
  });
});

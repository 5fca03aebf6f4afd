import { type Server, type Socket, connect, createServer } from 'node:net';
import { once } from 'node:events';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Controller, Get } from '@nestjs/common';
import request from 'supertest';
import { RateLimit } from 'nest-rate-limit';
import { type RateLimitStore, type RedisService, rateLimitKey } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { RedisService as RedisServiceToken } from 'nest-rate-limit/store';
import { createStore, hit } from '../support/store-module.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { LogCapture } from '../support/log-capture.js';

/** A loopback TCP proxy to Redis that can drop the connection just as a script's reply comes back. */
class DroppingProxy {
  private readonly server: Server;
  private dropNextArrayReply = false;
  private refuseUntil = 0;

  constructor(redisPort: number) {
    this.server = createServer((client: Socket) => {
      if (performance.now() < this.refuseUntil) {
        client.destroy();
        return;
      }
      const upstream = connect(redisPort, '127.0.0.1');
      client.on('data', (data) => upstream.write(data));
      upstream.on('data', (data) => {
        // A consume script's reply for one rule: an array of integers, two (the fast script) or six
        // (the full one), possibly sharing a chunk with other replies.
        if (this.dropNextArrayReply && /\*[26]\r\n:/.test(data.toString('latin1'))) {
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

  /** Closes new connections at once for a while, as a server that is restarting would. */
  refuseConnectionsFor(ms: number): void {
    this.refuseUntil = performance.now() + ms;
  }

  close(): void {
    this.server.close();
  }
}

describe('the library’s own Redis connection', () => {
  let server: RedisServer;
  let redis: Redis;
  let proxy: DroppingProxy;
  let proxyPort: number;
  let store: RateLimitStore;
  let service: RedisService;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    proxy = new DroppingProxy(server.port);
    proxyPort = await proxy.listen();
    const port = proxyPort;
    ({
      store,
      redis: service,
      close,
    } = await createStore({ redis: `redis://127.0.0.1:${port}`, storeErrors: { timeoutMs: 1_000 } }));
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
    expect(await fixedWindowCount(redis, key)).toBe(1);

    if (service.client.status !== 'ready') await once(service.client, 'ready');
    const next = await store.consume([hit(key, limits)]);
    expect(next.decisions[0].remaining).toBe(98);
    expect(await fixedWindowCount(redis, key)).toBe(2);
  });

  it('records again a request whose call may have run only once Redis seemed down: then it counts twice, never not at all', async () => {
    @Controller('dropped')
    class DroppedController {
      @Get()
      @RateLimit({ name: 'dropped', count: 100, window: '1h', by: 'global' })
      get() {
        return {};
      }
    }
    const prefix = uniquePrefix();
    const logs = new LogCapture();
    const app = await createTestApp({
      controllers: [DroppedController],
      rateLimit: { redis: `redis://127.0.0.1:${proxyPort}`, keyPrefix: prefix, storeErrors: { timeoutMs: 1_000 } },
      logger: logs,
    });
    try {
      const key = rateLimitKey(prefix, 'dropped', 'global', 'fixed-window');
      proxy.dropNextReply();
      // The reconnect fails too: the call's fate is unknown to the client.
      proxy.refuseConnectionsFor(300);
      // The call ran in Redis, its reply was lost with the connection: the fallback admits it.
      await request(app.getHttpServer()).get('/dropped').expect(200);
      expect(await fixedWindowCount(redis, key)).toBe(1);
      expect(logs.at('error', /Rate-limit store failed/)).toHaveLength(1);
      const service = app.get(RedisServiceToken);
      if (service.client.status !== 'ready') await once(service.client, 'ready');
      // The reply never came, within the deadline and a second more: the fallback's admission is
      // recorded, right after the next answer, before the next request's call. It ran too:
      // counted twice (a killed master would not have run it).
      await until(() => service.runner.lateCalls.unanswered === 1, { timeoutMs: 5_000, what: 'the lost call judged' });
      await request(app.getHttpServer()).get('/dropped').expect(200);
      await request(app.getHttpServer()).get('/dropped').expect(200);
      expect(await fixedWindowCount(redis, key)).toBe(4);
    } finally {
      await app.close();
    }
  });
});

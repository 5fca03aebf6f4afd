import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fixedWindowCount } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import {
  type RedisSentinelSet,
  type RedisServer,
  startRedisSentinelSet,
  startRedisServer,
} from '../support/redis-server.js';
import { failOver, untilCountedOn } from '../support/sentinel-failover.js';
import { until } from '../support/poll.js';
import { createStore, hit } from '../support/store-module.js';
import { startAlertProxy } from '../support/tls-alert-proxy.js';
import { type TlsFiles, createTlsFiles } from '../support/tls-certs.js';
import { uniquePrefix } from '../support/test-app.js';

/*
 * Redis over TLS: servers that speak TLS only, with a CA and certificate generated here. The
 * library takes a `rediss://` URL and ioredis's TLS options as they are.
 */

const limits = { limit: 3, windowMs: 600_000 };

describe('TLS', () => {
  let tls: TlsFiles;

  beforeAll(() => {
    tls = createTlsFiles();
  });

  afterAll(() => tls?.remove());

  describe('a standalone server', () => {
    let server: RedisServer;

    beforeAll(async () => {
      server = await startRedisServer([], undefined, tls);
    });

    afterAll(() => server?.stop());

    it('counts through rediss:// with the CA given as ioredis TLS options', async () => {
      expect(server.url).toMatch(/^rediss:\/\//);
      const { store, redis, close } = await createStore({ redis: { url: server.url, tls: { ca: tls.ca } } });
      const key = `${uniquePrefix()}:{t}:r:fw`;
      try {
        const allowed = [];
        for (let i = 0; i < 4; i += 1) allowed.push((await store.consume([hit(key, limits)])).allowed);
        expect(allowed).toEqual([true, true, true, false]);
        expect(await fixedWindowCount(server.client(), key)).toBe(3);
        expect(await redis.reachable()).toBe(true);
      } finally {
        await close();
      }
    });

    it('refuses a server whose certificate it cannot verify: the error is logged, requests follow the policy', async () => {
      const logs = new LogCapture();
      // No CA: the test CA is not trusted.
      const { limiter, close } = await createStore({ redis: server.url, storeErrors: { policy: 'deny' } }, logs);
      try {
        expect(logs.at('error', /not reachable yet: .*certificate/i)).toHaveLength(1);
        const outcome = await limiter.consume([{ name: 'tls', count: 3, window: '10m' }], 'someone');
        expect(outcome).toMatchObject({ allowed: false, storeError: 'deny' });
      } finally {
        await close();
      }
    });
  });

  describe('a server that sends an alert with its handshake', () => {
    let server: RedisServer;
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => uncaught.push(error);

    beforeAll(async () => {
      server = await startRedisServer([], undefined, tls);
      process.on('uncaughtException', onUncaught);
    });

    afterAll(async () => {
      process.off('uncaughtException', onUncaught);
      await server?.stop();
    });

    // The certificate refused is the socket's first error, the alert read with it a second one,
    // which ioredis (listening once) does not hear: it was an uncaught exception that ended the app.
    it('logs the error after a refused certificate, and the process lives on', async () => {
      const proxy = await startAlertProxy(server.port);
      const logs = new LogCapture();
      const { limiter, close } = await createStore(
        { redis: { host: '127.0.0.1', port: proxy.port, tls: {} }, storeErrors: { policy: 'deny' } },
        logs,
      );
      try {
        await until(async () => proxy.alertsSent >= 3, {
          timeoutMs: 15_000,
          intervalMs: 20,
          what: 'three connections meeting the alert',
        });
        expect(uncaught).toEqual([]);
        expect(logs.at('error', /^Redis connection error: Error: .*alert/)).not.toHaveLength(0);
        const outcome = await limiter.consume([{ name: 'tls', count: 3, window: '10m' }], 'someone');
        expect(outcome).toMatchObject({ allowed: false, storeError: 'deny' });
      } finally {
        await close();
        await proxy.close();
      }
    });
  });

  describe('behind Sentinel', () => {
    let set: RedisSentinelSet;

    beforeAll(async () => {
      set = await startRedisSentinelSet(1_000, 'tlsmaster', tls);
    }, 60_000);

    afterAll(() => set?.stop());

    it('counts on the master the sentinels name over TLS, and follows it after a failover', async () => {
      const { store, redis, close } = await createStore({
        redis: {
          sentinels: set.sentinelAddresses,
          name: set.name,
          tls: { ca: tls.ca },
          sentinelTLS: { ca: tls.ca },
          enableTLSForSentinelMode: true,
        },
        storeErrors: { timeoutMs: 1_000 },
      });
      const key = `${uniquePrefix()}:{s}:r:fw`;
      try {
        expect(await store.consume([hit(key, limits)])).toMatchObject({ allowed: true });
        const master: Redis = set.master.client();
        expect(await fixedWindowCount(master, key)).toBe(1);
        expect(await master.call('WAIT', '1', '5000')).toBe(1);

        const replica = await failOver(set);
        await untilCountedOn(replica, key, 2, () => store.consume([hit(key, limits)]));
        expect(redis.client.status).toBe('ready');
      } finally {
        await close();
      }
    }, 60_000);
  });
});

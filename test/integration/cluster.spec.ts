import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import { Cluster } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RateLimitHit, type RateLimitStore, rateLimitKey } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { type RedisCluster, startRedisCluster } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { LogCapture } from '../support/log-capture.js';
import { burst, sequential } from '../support/traffic.js';

const byUser = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

/**
 * Counted for all, through a function: decided with the per-user rule after the app's guards, in
 * one call across two slots (`by: 'global'` alone would be decided before them, in a call of its own).
 */
const everyone = () => 'global';

@Controller('cluster')
@RateLimit({ name: 'route', count: 1_000, window: '1m', by: everyone })
class ClusterController {
  @Get()
  @RateLimit({ name: 'user', count: 3, window: '1m', by: byUser })
  get() {
    return {};
  }
}

describe('on a 3-master Redis Cluster', () => {
  let cluster: RedisCluster;
  let reader: Cluster;

  beforeAll(async () => {
    cluster = await startRedisCluster(3);
    reader = new Cluster(cluster.startupNodes);
  });

  afterAll(async () => {
    reader?.disconnect();
    await cluster?.stop();
  });

  it('keeps limits exact across slots with three app instances, and the route counter equals the admitted', async () => {
    const logs = new LogCapture();
    const prefix = uniquePrefix();
    const apps: INestApplication[] = await Promise.all(
      [1, 2, 3].map(() =>
        createTestApp({
          controllers: [ClusterController],
          rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix: prefix },
          logger: logs,
        }),
      ),
    );
    try {
      const servers = apps.map((app) => app.getHttpServer());
      let admitted = 0;
      for (let user = 0; user < 10; user += 1) {
        const { statuses } = await burst(20, (i) =>
          request(servers[i % 3])
            .get('/cluster')
            .set('x-user', `u${user}`),
        );
        expect(statuses.filter((s) => s === 200)).toHaveLength(3);
        admitted += 3;
        expect(await fixedWindowCount(reader, rateLimitKey(prefix, 'user', `u${user}`, 'fixed-window'))).toBe(3);
      }
      // The route rule lives in another slot; rejected requests were refunded there.
      expect(await fixedWindowCount(reader, rateLimitKey(prefix, 'route', 'global', 'fixed-window'))).toBe(admitted);
      // Every decision came from Redis: no store error made the fallback decide.
      expect(logs.at('error')).toEqual([]);
    } finally {
      await Promise.all(apps.map((app) => app.close()));
    }
  });

  it('finds every key it writes where it reads it: on the master that owns the key’s slot', async () => {
    const prefix = uniquePrefix();
    const app = await createTestApp({
      controllers: [ClusterController],
      rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix: prefix },
    });
    try {
      const spread = await sequential(30, (user) =>
        request(app.getHttpServer()).get('/cluster').set('x-user', `spread-${user}`),
      );
      expect(spread.statuses).toEqual(Array(30).fill(200));
      // Which node owns which slots, as the cluster itself says.
      const ranges = await reader.cluster('SLOTS');
      const ownerOf = (slot: number) => ranges.find(([from, to]) => slot >= from && slot <= to)![2][1];
      let found = 0;
      for (const node of cluster.nodes) {
        for (const key of await node.client().keys(`${prefix}:*`)) {
          const slot = Number(await reader.cluster('KEYSLOT', key));
          expect(ownerOf(slot)).toBe(node.port);
          expect(await reader.exists(key)).toBe(1); // routed reads find it
          found += 1;
        }
      }
      expect(found).toBe(31); // 30 users and the route
    } finally {
      await app.close();
    }
  });

  describe('the store', () => {
    let store: RateLimitStore;
    let close: () => Promise<void>;

    beforeAll(async () => {
      ({ store, close } = await createStore({ redis: { cluster: cluster.startupNodes } }));
    });

    afterAll(() => close?.());

    it('decides rules of one identity in one call, and moves no counter when another slot rejects', async () => {
      const prefix = uniquePrefix();
      const keys = { a: `${prefix}:{alice}:a:fw`, b: `${prefix}:{bob}:b:fw`, c: `${prefix}:{carol}:c:sl` };
      const slots = await Promise.all(Object.values(keys).map((key) => reader.cluster('KEYSLOT', key)));
      expect(new Set(slots).size).toBe(3);
      const hits: RateLimitHit[] = [
        hit(keys.a, { limit: 5, windowMs: 60_000 }),
        hit(keys.b, { limit: 1, windowMs: 60_000 }),
        hit(keys.c, { limit: 5, windowMs: 60_000, algorithm: 'sliding-log' }),
      ];
      const first = await store.consume(hits);
      expect(first.allowed).toBe(true);
      const second = await store.consume(hits);
      expect(second.allowed).toBe(false);
      expect(second.decisions.map((d) => d.allowed)).toEqual([true, false, true]);
      // The slots that admitted were refunded: every counter is where the first request left it.
      expect(await fixedWindowCount(reader, keys.a)).toBe(1);
      expect(await fixedWindowCount(reader, keys.b)).toBe(1);
      expect(await reader.zcard(keys.c)).toBe(1);
    });

    it('refunds the slots that admitted when another slot fails, then reports the failure', async () => {
      const prefix = uniquePrefix();
      const keys = { alice: `${prefix}:{alice}:a:fw`, bob: `${prefix}:{bob}:b:fw` };
      const slotOf = async (key: string) => Number(await reader.cluster('KEYSLOT', key));
      const nodeOf = async (key: string) => cluster.nodes[Math.floor((await slotOf(key)) / Math.ceil(16384 / 3))];
      expect(await nodeOf(keys.alice)).not.toBe(await nodeOf(keys.bob));
      const bobsNode = await nodeOf(keys.bob);
      const hits = [hit(keys.alice, { limit: 5, windowMs: 60_000 }), hit(keys.bob, { limit: 5, windowMs: 60_000 })];
      process.kill(bobsNode.pid, 'SIGSTOP');
      try {
        await expect(store.consume(hits)).rejects.toThrow('did not answer');
        // Alice's slot admitted and was refunded before the failure was reported.
        expect(await fixedWindowCount(reader, keys.alice)).toBe(0);
      } finally {
        process.kill(bobsNode.pid, 'SIGCONT');
      }
    });

    it('places every key of an identity in the slot of its tag, whatever the client sent', async () => {
      const prefix = uniquePrefix();
      const app = await createTestApp({
        controllers: [ClusterController],
        rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix: prefix },
      });
      try {
        const identities = ['{evil}', 'x{global}y', 'plain', '}{'];
        const sent = await sequential(identities.length, (i) =>
          request(app.getHttpServer()).get('/cluster').set('x-user', identities[i]),
        );
        expect(sent.statuses).toEqual([200, 200, 200, 200]);
        const keys = (await Promise.all(cluster.nodes.map((node) => node.client().keys(`${prefix}:*`)))).flat();
        expect(keys).toHaveLength(5);
        for (const key of keys) {
          const tag = /\{([^}]*)\}/.exec(key)![1];
          expect(tag).not.toMatch(/[{}]/);
          expect(await reader.cluster('KEYSLOT', key)).toBe(await reader.cluster('KEYSLOT', tag));
        }
        expect(keys.filter((key) => key.includes('{global}'))).toEqual([
          rateLimitKey(prefix, 'route', 'global', 'fixed-window'),
        ]);
      } finally {
        await app.close();
      }
    });
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import { Cluster } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from '@app/rate-limit';
import { type RedisCluster, startRedisCluster } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

const LIMIT = 40;
const WINDOW_MS = 4_000;
const RATE_PER_S = (2 * LIMIT) / (WINDOW_MS / 1000);

@Controller('shard')
class ShardController {
  @Get()
  @RateLimit({ name: 'route', count: LIMIT, window: WINDOW_MS, by: 'global' })
  get() {
    return {};
  }
}

describe('a manual CLUSTER FAILOVER mid-traffic', () => {
  let cluster: RedisCluster;
  let apps: INestApplication[];

  beforeAll(async () => {
    cluster = await startRedisCluster(3, true);
    const prefix = uniquePrefix();
    apps = await Promise.all(
      [1, 2, 3].map(() =>
        createTestApp({
          controllers: [ShardController],
          rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix: prefix },
        }),
      ),
    );
  }, 60_000);

  afterAll(async () => {
    await Promise.all((apps ?? []).map((app) => app.close()));
    await cluster?.stop();
  });

  it('keeps the limiter working, at most 5% over the limit per window', async () => {
    const reader = new Cluster(cluster.startupNodes);
    try {
      const slot = Number(await reader.cluster('KEYSLOT', '{global}'));
      const shard = Math.floor(slot / Math.ceil(16384 / 3));
      const replica = cluster.replicas[shard].client();

      // Offered at twice the limit, evenly, over three windows; the failover in the second.
      const admittedAt: number[] = [];
      const fromRedisAfter: boolean[] = [];
      const started = performance.now();
      const total = 3 * (WINDOW_MS / 1000) * RATE_PER_S;
      let failedOver = false;
      const pending: Promise<void>[] = [];
      for (let i = 0; i < total; i += 1) {
        const due = (i * 1000) / RATE_PER_S;
        const wait = due - (performance.now() - started);
        if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
        if (!failedOver && due >= WINDOW_MS * 1.5) {
          failedOver = true;
          await replica.cluster('FAILOVER');
        }
        pending.push(
          request(apps[i % 3].getHttpServer())
            .get('/shard')
            .then((response) => {
              if (response.status === 200) admittedAt.push(due);
              if (due >= WINDOW_MS * 2.5) fromRedisAfter.push(response.headers['ratelimit-limit'] !== undefined);
            }),
        );
      }
      await Promise.all(pending);

      expect((await replica.info('replication')).includes('role:master')).toBe(true);
      for (let window = 0; window < 3; window += 1) {
        const admitted = admittedAt.filter((at) => at >= window * WINDOW_MS && at < (window + 1) * WINDOW_MS).length;
        expect(admitted, `window ${window}`).toBeLessThanOrEqual(Math.floor(LIMIT * 1.05));
        expect(admitted, `window ${window}`).toBeGreaterThan(LIMIT * 0.8);
      }
      // After the switch, Redis (the new master) decides again.
      expect(fromRedisAfter.some(Boolean)).toBe(true);
    } finally {
      reader.disconnect();
    }
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import { Cluster } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RedisCluster, startRedisCluster } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { admittedPerWindow, paced } from '../support/traffic.js';

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
      const { samples } = await paced({
        durationMs: 3 * WINDOW_MS,
        ratePerS: RATE_PER_S,
        send: (i) => request(apps[i % 3].getHttpServer()).get('/shard'),
        events: [{ atMs: WINDOW_MS * 1.5, run: () => replica.cluster('FAILOVER') }],
      });

      expect((await replica.info('replication')).includes('role:master')).toBe(true);
      for (const [window, admitted] of admittedPerWindow(samples, WINDOW_MS, 3).entries()) {
        expect(admitted, `window ${window}`).toBeLessThanOrEqual(Math.floor(LIMIT * 1.05));
        expect(admitted, `window ${window}`).toBeGreaterThan(LIMIT * 0.8);
      }
      // After the switch, Redis (the new master) decides again.
      expect(samples.some((s) => s.due >= WINDOW_MS * 2.5 && s.fromRedis)).toBe(true);
    } finally {
      reader.disconnect();
    }
  });
});

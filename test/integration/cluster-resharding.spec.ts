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

@Controller('moving')
class MovingController {
  @Get()
  @RateLimit({ name: 'route', count: LIMIT, window: WINDOW_MS, by: 'global' })
  get() {
    return {};
  }
}

describe('a slot resharded to another master mid-traffic (MIGRATING / IMPORTING, ASK, MOVED)', () => {
  let cluster: RedisCluster;
  let apps: INestApplication[];
  const prefix = uniquePrefix();

  beforeAll(async () => {
    cluster = await startRedisCluster(3);
    apps = await Promise.all(
      [1, 2, 3].map(() =>
        createTestApp({
          controllers: [MovingController],
          rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix: prefix },
        }),
      ),
    );
  });

  afterAll(async () => {
    await Promise.all((apps ?? []).map((app) => app.close()));
    await cluster?.stop();
  });

  it('keeps counting the same window across the move, at most 5% over the limit', async () => {
    const reader = new Cluster(cluster.startupNodes);
    try {
      const slot = Number(await reader.cluster('KEYSLOT', '{global}'));
      const from = cluster.nodes[Math.floor(slot / Math.ceil(16384 / 3))];
      const to = cluster.nodes.find((node) => node !== from)!;
      const [source, target] = [from.client(), to.client()];
      const [sourceId, targetId] = await Promise.all([
        source.call('CLUSTER', 'MYID') as Promise<string>,
        target.call('CLUSTER', 'MYID') as Promise<string>,
      ]);
      const reshard = async () => {
        await target.call('CLUSTER', 'SETSLOT', String(slot), 'IMPORTING', sourceId);
        await source.call('CLUSTER', 'SETSLOT', String(slot), 'MIGRATING', targetId);
        const keys = (await source.call('CLUSTER', 'GETKEYSINSLOT', String(slot), '100')) as string[];
        if (keys.length > 0) {
          await source.call('MIGRATE', '127.0.0.1', String(to.port), '', '0', '5000', 'KEYS', ...keys);
        }
        for (const node of cluster.nodes) {
          await node.client().call('CLUSTER', 'SETSLOT', String(slot), 'NODE', targetId);
        }
      };

      // Requests keep flowing while the slot moves.
      const { samples } = await paced({
        durationMs: 3 * WINDOW_MS,
        ratePerS: RATE_PER_S,
        send: (i) => request(apps[i % 3].getHttpServer()).get('/moving'),
        events: [{ atMs: WINDOW_MS * 1.25, run: reshard, inBackground: true }],
      });

      // The slot and the limiter's keys now live on the target.
      expect(await target.call('CLUSTER', 'COUNTKEYSINSLOT', String(slot))).toBeGreaterThan(0);
      expect(await source.call('CLUSTER', 'COUNTKEYSINSLOT', String(slot))).toBe(0);
      for (const [window, admitted] of admittedPerWindow(samples, WINDOW_MS, 3).entries()) {
        expect(admitted, `window ${window}`).toBeLessThanOrEqual(Math.floor(LIMIT * 1.05));
        expect(admitted, `window ${window}`).toBeGreaterThan(LIMIT * 0.8);
      }
      expect(samples.filter((s) => s.due >= WINDOW_MS * 2.5).every((s) => s.fromRedis)).toBe(true);
    } finally {
      reader.disconnect();
    }
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { paced } from '../support/traffic.js';

/**
 * A 300-a-minute rule at 4 requests a second (80% of it), scaled down tenfold in time: 30 per 6 s
 * at 4 a second on each route.
 */
const LIMIT = 30;
const WINDOW_MS = 6_000;
const PER_ROUTE_PER_S = 4;

@Controller()
class ShopController {
  @Get('list')
  list() {
    return 'list';
  }

  @Get('item')
  item() {
    return 'item';
  }

  /** Its own rule, replacing the default here. */
  @Get('search')
  @RateLimit({ name: 'default', count: LIMIT, window: WINDOW_MS })
  search() {
    return 'search';
  }
}

const ROUTES = ['/list', '/item', '/search'];

describe('Redis restarted empty under traffic at 80% of the limit', () => {
  let server: RedisServer;
  let app: INestApplication;

  beforeAll(async () => {
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [ShopController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix(), defaults: [{ count: LIMIT, window: WINDOW_MS }] },
    });
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  it(
    'refuses nothing after it, and counts each request once (defaults and a declared rule)',
    { timeout: 120_000 },
    async () => {
      const restartAtMs = 6_500;
      const traffic = await paced({
        durationMs: restartAtMs + 3 * WINDOW_MS,
        ratePerS: PER_ROUTE_PER_S * ROUTES.length,
        send: (i) => request(app.getHttpServer()).get(ROUTES[i % ROUTES.length]),
        events: [
          {
            // Down for 2 s (the local fallback decides, and records its units once Redis is back),
            // then up again with nothing in it.
            atMs: restartAtMs,
            inBackground: true,
            run: async () => {
              const crashed = server;
              await crashed.kill();
              await new Promise((resolve) => setTimeout(resolve, 2_000));
              server = await startRedisServer([], crashed.port);
              await crashed.stop();
            },
          },
        ],
      });
      const after = traffic.samples.filter((s) => s.due >= restartAtMs);
      // Some were decided while Redis was out, and Redis decided again after it.
      expect(after.some((s) => !s.fromRedis)).toBe(true);
      expect(after.slice(-ROUTES.length).every((s) => s.fromRedis)).toBe(true);
      for (const [r, route] of ROUTES.entries()) {
        expect({
          route,
          refused: after.filter((s) => s.index % ROUTES.length === r && s.status !== 200).length,
        }).toEqual({
          route,
          refused: 0,
        });
      }

      // Each counter holds at most the requests of its window: at 4 a second, 24 in 6 s (one more
      // for a request on the window's edge), not those the fallback admitted before it as well.
      const redis = server.client();
      const counters = (await redis.keys('*')).filter((key) => key.endsWith(':fw'));
      expect(counters).toHaveLength(ROUTES.length);
      for (const key of counters) {
        expect({ key, count: Number(await redis.get(key)) }).toEqual({
          key,
          count: expect.toSatisfy((count: number) => count > 0 && count <= (PER_ROUTE_PER_S * WINDOW_MS) / 1000 + 1),
        });
      }
    },
  );
});

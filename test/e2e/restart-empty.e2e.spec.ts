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
      // One per route; a 6 s window may end (its key expiring with it) between the last request and
      // this read, which leaves one fewer.
      expect(counters.length).toBeGreaterThanOrEqual(ROUTES.length - 1);
      expect(counters.length).toBeLessThanOrEqual(ROUTES.length);
      for (const key of counters) {
        expect({ key, count: Number(await redis.get(key)) }).toEqual({
          key,
          count: expect.toSatisfy((count: number) => count > 0 && count <= (PER_ROUTE_PER_S * WINDOW_MS) / 1000 + 1),
        });
      }
    },
  );
});

/** The module's default at its real figures: 300 a minute, and a client at 4 a second on each route (80%). */
const DEFAULT_PER_MINUTE = 300;
/** A tighter limit being tried beside it on every route, in shadow mode (as the demo's `GET /shadow`): it never refuses. */
const TRIAL = { name: 'trial', count: 3, window: 10_000, mode: 'shadow' } as const;

@Controller()
class TrialController {
  @Get('list')
  @RateLimit(TRIAL)
  list() {
    return 'list';
  }

  @Get('item')
  @RateLimit(TRIAL)
  item() {
    return 'item';
  }

  /** Its own rule, replacing the default here. */
  @Get('search')
  @RateLimit({ name: 'default', count: DEFAULT_PER_MINUTE, window: 60_000 })
  @RateLimit(TRIAL)
  search() {
    return 'search';
  }
}

describe('Redis restarted empty, routes with a second rule beside the default (300 a minute, 4 a second)', () => {
  let server: RedisServer;
  let app: INestApplication;

  beforeAll(async () => {
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [TrialController],
      rateLimit: {
        redis: server.url,
        keyPrefix: uniquePrefix(),
        defaults: [{ count: DEFAULT_PER_MINUTE, window: 60_000 }],
      },
    });
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  it(
    'refuses nothing after it: a share the fallback held of another rule refuses no key for the window',
    { timeout: 120_000 },
    async () => {
      // The trial rule's first window starts at the first request and ends 10 s later, while Redis
      // is down (9 s to 12 s): the fallback decides a window of its own there, and the share it
      // held of it (a few units of 3) is used up when Redis, back empty, admits again.
      const restartAtMs = 9_000;
      const afterMs = 15_000;
      const traffic = await paced({
        durationMs: restartAtMs + 3_000 + afterMs,
        ratePerS: PER_ROUTE_PER_S * ROUTES.length,
        send: (i) => request(app.getHttpServer()).get(ROUTES[i % ROUTES.length]),
        events: [
          {
            atMs: restartAtMs,
            inBackground: true,
            run: async () => {
              const crashed = server;
              await crashed.kill();
              await new Promise((resolve) => setTimeout(resolve, 3_000));
              server = await startRedisServer([], crashed.port);
              await crashed.stop();
            },
          },
        ],
      });
      const after = traffic.samples.filter((s) => s.due >= restartAtMs);
      expect(after.some((s) => !s.fromRedis)).toBe(true);
      expect(after.slice(-ROUTES.length).every((s) => s.fromRedis)).toBe(true);
      // Requests after it, and how many were refused, per route.
      const refused = Object.fromEntries(
        ROUTES.map((route, r) => {
          const ofRoute = after.filter((s) => s.index % ROUTES.length === r);
          return [route, `${ofRoute.filter((s) => s.status !== 200).length} of ${ofRoute.length}`];
        }),
      );
      expect(refused).toEqual(Object.fromEntries(ROUTES.map((route) => [route, expect.stringMatching(/^0 of \d+$/)])));
    },
  );
});

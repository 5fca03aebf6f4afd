import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { rateLimitKey } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { burst } from '../support/traffic.js';

const byUser = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

@Controller('exact')
class ExactController {
  @Get()
  @RateLimit({ name: 'exact', count: 3, window: '1m', by: byUser })
  get() {
    return { ok: true };
  }
}

@Controller('shared')
@RateLimit({ name: 'route', count: 25, window: '1m', by: 'global' })
class SharedRouteController {
  @Get()
  @RateLimit({ name: 'user', count: 4, window: '1m', by: byUser, algorithm: 'sliding-log' })
  get() {
    return { ok: true };
  }
}

describe('exactness across instances sharing one Redis', () => {
  let server: RedisServer;
  let redis: Redis;
  let apps: INestApplication[];
  const prefix = uniquePrefix();

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    apps = await Promise.all(
      [1, 2, 3].map(() =>
        createTestApp({
          controllers: [ExactController, SharedRouteController],
          rateLimit: { redis: server.url, keyPrefix: prefix },
        }),
      ),
    );
  });

  afterAll(async () => {
    await Promise.all((apps ?? []).map((app) => app.close()));
    await server?.stop();
  });

  it('admits exactly 3 of 40 concurrent requests for one identity, for each of 20 fresh keys, and stores 3', async () => {
    const servers = apps.map((app) => app.getHttpServer());
    for (let user = 0; user < 20; user += 1) {
      const { statuses } = await burst(40, (i) =>
        request(servers[i % servers.length])
          .get('/exact')
          .set('x-user', `user-${user}`),
      );
      expect(statuses.filter((status) => status === 200)).toHaveLength(3);
      expect(statuses.filter((status) => status === 429)).toHaveLength(37);
      expect(await fixedWindowCount(redis, rateLimitKey(prefix, 'exact', `user-${user}`, 'fixed-window'))).toBe(3);
    }
  });

  it('decides a route rule and per-user rules atomically under 200 concurrent requests', async () => {
    const servers = apps.map((app) => app.getHttpServer());
    const users = Array.from({ length: 10 }, (_, i) => `shared-${i}`);
    const userOf = (index: number) => users[index % users.length];
    const { samples } = await burst(200, (i) =>
      request(servers[i % 3])
        .get('/shared')
        .set('x-user', userOf(i)),
    );
    const admitted = samples.filter((r) => r.status === 200);
    // 10 users x 4 would be 40; the route admits 25 in all.
    expect(admitted).toHaveLength(25);
    expect(await fixedWindowCount(redis, rateLimitKey(prefix, 'route', 'global', 'fixed-window'))).toBe(25);
    for (const user of users) {
      // A sliding log keeps one sorted-set member per admission (each of cost 1 here).
      const count = await redis.zcard(rateLimitKey(prefix, 'user', user, 'sliding-log'));
      expect(count).toBe(admitted.filter((r) => userOf(r.index) === user).length);
      expect(count).toBeLessThanOrEqual(4);
    }
  });
});

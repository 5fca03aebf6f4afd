import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

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
        createTestApp({ controllers: [ExactController], rateLimit: { redis: server.url, keyPrefix: prefix } }),
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
      const statuses = await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          request(servers[i % servers.length])
            .get('/exact')
            .set('x-user', `user-${user}`)
            .then((r) => r.status),
        ),
      );
      expect(statuses.filter((status) => status === 200)).toHaveLength(3);
      expect(statuses.filter((status) => status === 429)).toHaveLength(37);
      expect(await redis.hget(`${prefix}:{user-${user}}:exact:fw`, 'c')).toBe('3');
    }
  });
});

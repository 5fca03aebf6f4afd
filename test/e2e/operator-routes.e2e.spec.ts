import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { describeStores } from '../support/matrix.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { fill } from '../support/fill-redis.js';
import { uniquePrefix } from '../support/test-app.js';

/*
 * The demo's admin endpoints are the operator's: no rule limits them, so no ban reaches them (the
 * operator lifts a ban of their own address there), and a change Redis cannot take answers 503
 * with why, not a 500.
 */

const TOKEN = 'operator-token';
const savedEnv = { ...process.env };

async function startDemo(redisUrl: string | undefined): Promise<INestApplication> {
  process.env = { ...savedEnv, ADMIN_TOKEN: TOKEN, RATE_LIMIT_PREFIX: uniquePrefix() };
  if (redisUrl) process.env.REDIS_URL = redisUrl;
  else delete process.env.REDIS_URL;
  const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  await app.init();
  return app;
}

afterAll(() => {
  process.env = savedEnv;
});

describeStores('the demo’s admin endpoints', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  const admin = (method: 'get' | 'put' | 'delete', path: string) =>
    request(app!.getHttpServer())[method](path).set('authorization', `Bearer ${TOKEN}`);

  it("a '*' ban of the operator's own address leaves them the admin endpoints, to lift it there", async () => {
    app = await startDemo(await store.redis());
    // Supertest calls from the loopback address.
    const banned = await admin('put', '/admin/bans/*/127.0.0.1').send({ for: '1h' }).expect(200);
    expect(banned.body).toMatchObject({ rule: '*', identity: '127.0.0.1' });
    const refused = await request(app.getHttpServer()).get('/ip').expect(403);
    expect(refused.body.message).toBe('Refused: banned; retry in 3600 s');

    const bans = await admin('get', '/admin/bans').expect(200);
    expect(bans.body).toEqual([expect.objectContaining({ rule: '*', identity: '127.0.0.1' })]);
    await admin('get', '/admin/limits').expect(200);
    expect((await admin('delete', '/admin/bans/*/127.0.0.1').expect(200)).body).toEqual({ unbanned: true });
    await request(app.getHttpServer()).get('/ip').expect(200);
  });

  it('bans a network; refuses an address written so that no client is it, and a duration without a unit', async () => {
    app = await startDemo(await store.redis());
    const banned = await admin('put', `/admin/bans/*/${encodeURIComponent('127.0.0.0/8')}`)
      .send({ for: '10m' })
      .expect(200);
    expect(banned.body).toMatchObject({ identity: '127.0.0.0/8' });
    await request(app.getHttpServer()).get('/ip').expect(403);
    await admin('delete', `/admin/bans/*/${encodeURIComponent('127.0.0.0/8')}`).expect(200);

    const zeros = await admin('put', '/admin/bans/LimitsController.byIp/127.000.0.1').send({ for: '10m' }).expect(400);
    expect(JSON.stringify(zeros.body.message)).toContain('four decimal parts without leading zeros (203.0.113.7)');
    const number = await admin('put', '/admin/bans/LimitsController.byIp/2130706433').send({ for: '10m' }).expect(400);
    expect(JSON.stringify(number.body.message)).toContain('a network of either (203.0.113.0/24, 2001:db8::/48)');

    const bare = await admin('put', '/admin/bans/*/192.0.2.1').send({ for: '60' }).expect(400);
    expect(bare.body.message).toBe(`Body: 'for' has no unit; give one, such as { "for": "60s" } or { "for": "1h" }`);
    expect((await admin('get', '/admin/bans').expect(200)).body).toEqual([]);
  });
});

describe('the demo’s admin endpoints on a full Redis (maxmemory, noeviction)', () => {
  let server: RedisServer;
  let app: INestApplication | undefined;
  beforeAll(async () => {
    server = await startRedisServer(['--maxmemory', '2mb', '--maxmemory-policy', 'noeviction']);
  });
  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  it('a write answers 503 saying Redis is full and nothing was changed; reads still answer', async () => {
    app = await startDemo(server.url);
    expect(await fill(server)).toBe('refused');
    const admin = (method: 'get' | 'put' | 'patch', path: string) =>
      request(app!.getHttpServer())[method](path).set('authorization', `Bearer ${TOKEN}`);

    const ban = await admin('put', '/admin/bans/*/192.0.2.1').send({ for: '1h' }).expect(503);
    expect(ban.body.message).toMatch(
      /^RateLimitManagementService\.ban: Redis is out of memory \(maxmemory reached under maxmemory-policy noeviction\) and refused the write; free memory there or raise maxmemory; nothing was changed\./,
    );
    const set = await admin('patch', '/admin/limits/demo.config').send({ count: 5 }).expect(503);
    expect(set.body.message).toContain('Redis is out of memory');
    await admin('get', '/admin/bans').expect(200);
    expect((await admin('get', '/admin/limits/demo.config').expect(200)).body.written).toBeUndefined();
  });
});

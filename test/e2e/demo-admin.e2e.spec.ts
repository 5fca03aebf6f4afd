import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, afterEach, expect, it } from 'vitest';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { describeStores } from '../support/matrix.js';
import { uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

/*
 * What the demo's admin endpoints for bans, overrides and the change log do to the routes they
 * govern, seen from the clients: a ban refuses the banned identity and nobody else until it is
 * lifted, an override gives one identity a limit of its own, and the change log lists each change
 * with the token's name. (The operator's own routes, beyond every rule: operator-routes.e2e.spec.ts.)
 */

const TOKEN = 'demo-admin-token';
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

const repeat = (status: number, n: number) => Array.from({ length: n }, () => status);

describeStores('the demo’s admin endpoints for bans, overrides and the change log', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  const admin = (method: 'get' | 'put' | 'delete', path: string, token = TOKEN) =>
    request(app!.getHttpServer())[method](path).set('authorization', `Bearer ${token}`);
  const withKey = (key: string) => request(app!.getHttpServer()).get('/key').set('x-api-key', key);

  it('a ban refuses the banned client only, until it is lifted; a wrong token changes nothing', async () => {
    app = await startDemo(await store.redis());
    await admin('put', '/admin/bans/LimitsController.byApiKey/blocked-key', 'wrong').send({ for: '1h' }).expect(401);
    expect((await withKey('blocked-key')).status).toBe(200);

    await admin('put', '/admin/bans/LimitsController.byApiKey/blocked-key').send({ for: '1h' }).expect(200);
    expect((await withKey('blocked-key')).status).toBe(403);
    expect((await withKey('other-key')).status).toBe(200);
    const bans = (await admin('get', '/admin/bans').expect(200)).body as { identity: string }[];
    expect(bans.map((ban) => ban.identity)).toEqual(['blocked-key']);

    await admin('delete', '/admin/bans/LimitsController.byApiKey/blocked-key', 'wrong').expect(401);
    expect((await withKey('blocked-key')).status).toBe(403);
    expect((await admin('delete', '/admin/bans/LimitsController.byApiKey/blocked-key').expect(200)).body).toEqual({
      unbanned: true,
    });
    expect((await withKey('blocked-key')).status).toBe(200);
    expect((await admin('get', '/admin/bans').expect(200)).body).toEqual([]);
  });

  it('an override gives one tenant a limit of its own, and ends; the change log lists each change by the token’s name', async () => {
    app = await startDemo(await store.redis());
    // Pro tenants: 20 a minute under 'demo.reports.pro', the key of their tier.
    const tenant = (name: string) => ({ 'x-tenant': name, 'x-plan': 'pro' });
    await admin('put', '/admin/overrides/demo.reports.pro/acme', 'wrong').send({ count: 8, for: '1h' }).expect(401);
    const set = await admin('put', '/admin/overrides/demo.reports.pro/acme').send({ count: 8, for: '1h' });
    expect([set.status, set.body]).toEqual([200, expect.objectContaining({ identity: 'acme', values: { count: 8 } })]);
    const overrides = (await admin('get', '/admin/overrides').expect(200)).body as { identity: string }[];
    expect(overrides.map((override) => override.identity)).toEqual(['acme']);
    // 8 for acme with it, 20 (the plan's) for another pro tenant.
    expect(await statuses(app, '/reports', 9, tenant('acme'))).toEqual([...repeat(200, 8), 429]);
    expect(await statuses(app, '/reports', 21, tenant('globex'))).toEqual([...repeat(200, 20), 429]);

    expect((await admin('delete', '/admin/overrides/demo.reports.pro/acme').expect(200)).body).toEqual({
      deleted: true,
    });
    expect((await admin('get', '/admin/overrides').expect(200)).body).toEqual([]);
    // Back to the plan's 20: acme has 12 left.
    expect(await statuses(app, '/reports', 13, tenant('acme'))).toEqual([...repeat(200, 12), 429]);

    await admin('put', '/admin/bans/*/203.0.113.9').send({ for: '10m' }).expect(200);
    await admin('delete', '/admin/bans/*/203.0.113.9').expect(200);
    await admin('get', '/admin/changes', 'wrong').expect(401);
    const changes = (await admin('get', '/admin/changes').expect(200)).body as {
      by: string;
      change: string;
      identity?: string;
    }[];
    // Newest first; refused calls (the wrong token) changed nothing and are not there.
    expect(changes.map(({ by, change, identity }) => ({ by, change, identity }))).toEqual([
      { by: 'admin', change: 'unban', identity: '203.0.113.9' },
      { by: 'admin', change: 'ban', identity: '203.0.113.9' },
      { by: 'admin', change: 'delete-override', identity: 'acme' },
      { by: 'admin', change: 'set-override', identity: 'acme' },
    ]);
  });
});

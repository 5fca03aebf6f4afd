import type { INestApplication } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { RateLimiterService } from 'nest-rate-limit';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { describeStores } from '../support/matrix.js';
import { usedOnceSettled } from '../support/poll.js';
import { uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

const repeat = (status: number, n: number) => Array.from({ length: n }, () => status);

describeStores('the demo app’s documented endpoints', (store) => {
  let app: INestApplication;
  const env = { ...process.env };

  beforeAll(async () => {
    const url = await store.redis();
    if (url) process.env.REDIS_URL = url;
    else delete process.env.REDIS_URL;
    process.env.RATE_LIMIT_PREFIX = uniquePrefix();
  });

  afterEach(async () => {
    await app?.close();
    process.env = { ...env, REDIS_URL: process.env.REDIS_URL, RATE_LIMIT_PREFIX: uniquePrefix() };
  });

  afterAll(() => {
    process.env = env;
  });

  async function start(extraEnv: Record<string, string> = {}, { trustProxy = false } = {}) {
    Object.assign(process.env, extraEnv);
    const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
    app = moduleRef.createNestApplication<NestExpressApplication>({ logger: false });
    // As the demo's TRUST_PROXY=1 does, so a test can send from other addresses.
    if (trustProxy) (app as NestExpressApplication).set('trust proxy', 1);
    await app.init();
    return app;
  }

  it('GET /ip: 5 per 10 s per client IP', async () => {
    await start();
    expect(await statuses(app, '/ip', 6)).toEqual([...repeat(200, 5), 429]);
  });

  it('GET /key: 3 per 10 s per x-api-key; 400 without the header', async () => {
    await start();
    const missing = await request(app.getHttpServer()).get('/key').expect(400);
    expect(missing.body.message).toBe('The x-api-key header is required');
    expect(await statuses(app, '/key', 4, { 'x-api-key': 'alpha' })).toEqual([200, 200, 200, 429]);
    expect(await statuses(app, '/key', 1, { 'x-api-key': 'beta' })).toEqual([200]);
  });

  it('GET /config: one counter, 10 per 60 s by default', async () => {
    await start();
    expect(await statuses(app, '/config', 11)).toEqual([...repeat(200, 10), 429]);
  });

  it('GET /config: threshold from RATE_LIMIT_DEMO_CONFIG_COUNT / _WINDOW', async () => {
    await start({ RATE_LIMIT_DEMO_CONFIG_COUNT: '2', RATE_LIMIT_DEMO_CONFIG_WINDOW: '1h' });
    const first = await request(app.getHttpServer()).get('/config').expect(200);
    expect(first.headers['ratelimit-limit']).toBe('2');
    expect(first.headers['ratelimit-reset']).toBe('3600');
    expect(await statuses(app, '/config', 2)).toEqual([200, 429]);
  });

  it('GET /ping: 100 per second by default, overridable with RATE_LIMIT_DEMO_PING_COUNT', async () => {
    await start();
    const first = await request(app.getHttpServer()).get('/ping').expect(200);
    expect(first.headers['ratelimit-limit']).toBe('100');
    process.env.RATE_LIMIT_DEMO_PING_COUNT = '1';
    await request(app.getHttpServer()).get('/ping').expect(429);
  });

  it('GET /reports: per tenant and plan; internal callers not counted', async () => {
    await start();
    const tenant = (name: string, plan?: string) => ({ 'x-tenant': name, ...(plan ? { 'x-plan': plan } : {}) });
    expect(await statuses(app, '/reports', 6, tenant('acme'))).toEqual([...repeat(200, 5), 429]);
    expect(await statuses(app, '/reports', 21, tenant('globex', 'pro'))).toEqual([...repeat(200, 20), 429]);
    expect(await statuses(app, '/reports', 3, { ...tenant('acme'), 'x-internal': 'yes' })).toEqual(repeat(200, 3));
  });

  it('POST /completions: an estimate reserved, the tokens used charged after', async () => {
    await start();
    const first = await request(app.getHttpServer())
      .post('/completions')
      .set('x-tenant', 'acme')
      .send({ prompt: 'x'.repeat(400), max_tokens: 1_000 })
      .expect(201);
    expect(first.body.usage).toEqual({ total_tokens: 150 });
    // Settled once the answer is out.
    expect(await usedOnceSettled(app.get(RateLimiterService), 'CompletionsController.complete', 'acme', 150)).toBe(150);
  });

  it('the default rule on every route (tuned live, here to 3 by its config key), not on /ping; probes not counted', async () => {
    await start({ RATE_LIMIT_DEMO_DEFAULT_COUNT: '3' }, { trustProxy: true });
    // On /ip besides the route's own 5.
    expect(await statuses(app, '/ip', 4)).toEqual([200, 200, 200, 429]);
    expect(await statuses(app, '/ping', 4)).toEqual(repeat(200, 4));
    const probe = { 'user-agent': 'kube-probe/1.31' };
    expect(await statuses(app, '/ip', 2, probe)).toEqual([200, 200]);
    expect(await statuses(app, '/ip', 2, { ...probe, 'x-forwarded-for': '10.2.3.4' })).toEqual([200, 200]);
    // From elsewhere the header is anyone's to send: counted like any client.
    expect(await statuses(app, '/ip', 4, { ...probe, 'x-forwarded-for': '198.51.100.9' })).toEqual([
      200, 200, 200, 429,
    ]);
  });

  it('GET /orders and /orders/:id: a class limit of 10 with a handler override of 4', async () => {
    await start();
    expect(await statuses(app, '/orders/7', 5)).toEqual([...repeat(200, 4), 429]);
    process.env.RATE_LIMIT_PREFIX = uniquePrefix();
    await app.close();
    await start();
    expect(await statuses(app, '/orders', 11)).toEqual([...repeat(200, 10), 429]);
  });

  it('GET /hot: a global budget leased 5 at a time, exact on one instance', async () => {
    await start();
    const first = await request(app.getHttpServer()).get('/hot').expect(200);
    expect(first.headers['ratelimit-remaining']).toBe('19');
    expect(await statuses(app, '/hot', 20)).toEqual([...repeat(200, 19), 429]);
  });

  it('GET /geocode: 5 a second for the app; the others wait for room, and those past 3 s are refused at once', async () => {
    await start();
    await app.listen(0, '127.0.0.1');
    const url = `${await app.getUrl()}/geocode?q=Porto`;
    const send = (count: number) =>
      Promise.all(
        Array.from({ length: count }, async () => {
          const sent = performance.now();
          const response = await fetch(url);
          await response.arrayBuffer();
          return {
            status: response.status,
            ms: performance.now() - sent,
            timing: response.headers.get('server-timing'),
          };
        }),
      );
    // Three seconds' worth at most: all admitted, the last ten after waiting.
    const few = await send(12);
    expect(few.map(({ status }) => status)).toEqual(repeat(200, 12));
    expect(few.filter(({ timing }) => timing?.startsWith('rate-limit-wait;dur=')).length).toBeGreaterThanOrEqual(7);
    // More than 3 s' worth: the latecomers learn it at once.
    const many = await send(40);
    const refused = many.filter(({ status }) => status === 429);
    expect(refused.length).toBeGreaterThanOrEqual(20);
    expect(refused.filter(({ ms }) => ms < 500).length).toBeGreaterThanOrEqual(20);
  }, 20_000);

  it('GET /health: exempt, and reports the limiter (terminus)', async () => {
    await start();
    expect(await statuses(app, '/health', 30)).toEqual(repeat(200, 30));
    const { body } = await request(app.getHttpServer()).get('/health').expect(200);
    expect(body).toMatchObject({
      status: 'ok',
      info: { rate_limit: store.name === 'Redis' ? { status: 'up', redis: 'up' } : { status: 'up', store: 'memory' } },
    });
  });

  it('GET /metrics: the limiter’s decisions by rule and outcome', async () => {
    await start();
    await statuses(app, '/ip', 6);
    const metrics = await request(app.getHttpServer()).get('/metrics').expect(200);
    expect(metrics.headers['content-type']).toMatch(/^text\/plain/);
    expect(metrics.text).toContain('rate_limit_decisions_total{rule="LimitsController.byIp",outcome="allowed"} 5');
    expect(metrics.text).toContain('rate_limit_decisions_total{rule="LimitsController.byIp",outcome="rejected"} 1');
  });

  it('GET /shadow: shadow mode, never a 429', async () => {
    await start();
    expect(await statuses(app, '/shadow', 6)).toEqual(repeat(200, 6));
  });

  it('the admin endpoints: off without ADMIN_TOKEN; with it, a limit changed live, and refusals as 400', async () => {
    await start();
    await request(app.getHttpServer()).get('/admin/limits').expect(404);
    await app.close();
    await start({ ADMIN_TOKEN: 'demo-token', RATE_LIMIT_PREFIX: uniquePrefix() });
    const admin = (method: 'get' | 'patch' | 'delete', path: string) =>
      request(app.getHttpServer())[method](path).set('authorization', 'Bearer demo-token');
    await request(app.getHttpServer()).get('/admin/limits').set('authorization', 'Bearer wrong').expect(401);
    const set = await admin('patch', '/admin/limits/demo.config').send({ count: 2 }).expect(200);
    expect(set.body).toMatchObject({ written: { count: 2 }, rules: [{ inForce: { count: 2 } }] });
    expect(await statuses(app, '/config', 3)).toEqual([200, 200, 429]);
    const refused = await admin('patch', '/admin/limits/demo.config').send({ window: 'soon' }).expect(400);
    expect(refused.body.message[0]).toMatch(/'window' must be a positive duration/);
    const counter = await admin('get', '/admin/counters/LimitsController.fromConfig/anyone').expect(200);
    expect(counter.body).toMatchObject({ identity: 'global', used: 2, remaining: 0 });
    await admin('delete', '/admin/counters/LimitsController.fromConfig/anyone').expect(200);
    await admin('delete', '/admin/limits/demo.config').expect(200);
    expect(await statuses(app, '/config', 1)).toEqual([200]);
  });

  it('the admin endpoints without ADMIN_TOKEN: 404 however often they are called, never a 429', async () => {
    await start();
    const answers = [];
    for (let i = 0; i < 15; i += 1) {
      const call = request(app.getHttpServer()).get('/admin/limits');
      answers.push((await (i % 2 ? call.set('authorization', 'Bearer guess') : call)).status);
    }
    expect(answers).toEqual(repeat(404, 15));
  });

  it('the admin endpoints count only failed authentication: the operator’s own 400s never lock them out', async () => {
    await start({ ADMIN_TOKEN: 'demo-token' });
    const typos = [];
    for (let i = 0; i < 12; i += 1) {
      typos.push(
        (
          await request(app.getHttpServer())
            .patch('/admin/limits/demo.config')
            .set('authorization', 'Bearer demo-token')
            .send({ window: 'soon' })
        ).status,
      );
    }
    expect(typos).toEqual(repeat(400, 12));
    await request(app.getHttpServer()).get('/admin/limits').set('authorization', 'Bearer demo-token').expect(200);
  });

  it('the admin endpoints: wrong or missing tokens are locked out after 10; the right token from that address is not', async () => {
    await start({ ADMIN_TOKEN: 'demo-token' });
    const guesses = [];
    for (let i = 0; i < 10; i += 1) {
      const call = request(app.getHttpServer()).get('/admin/limits');
      guesses.push((await (i % 2 ? call : call.set('authorization', `Bearer guess-${i}`))).status);
    }
    expect(guesses).toEqual(repeat(401, 10));
    const locked = await request(app.getHttpServer())
      .get('/admin/limits')
      .set('authorization', 'Bearer guess')
      .expect(429);
    expect(Number(locked.headers['retry-after'])).toBeGreaterThan(890);
    await request(app.getHttpServer()).get('/admin/limits').expect(429);
    // Someone else at the operator's address locked it out: the operator's calls still pass.
    await request(app.getHttpServer()).get('/admin/limits').set('authorization', 'Bearer demo-token').expect(200);
    await request(app.getHttpServer()).get('/admin/limits').set('authorization', 'Bearer nope').expect(429);
    expect(locked.body.message).toContain("'admin-auth'");
  });

  it.each([
    ['fixed-window', 5],
    ['sliding-window', 5],
    ['sliding-log', 5],
    ['token-bucket', 5],
    ['gcra', 2],
  ])('GET /algorithms/%s: admits %d at once, then 429', async (algorithm, admitted) => {
    await start();
    expect(await statuses(app, `/algorithms/${algorithm}`, admitted + 1)).toEqual([...repeat(200, admitted), 429]);
  });

  it('GET /multi: three rules decided together; the client rule rejects the sixth', async () => {
    await start();
    expect(await statuses(app, '/multi', 5)).toEqual(repeat(200, 5));
    const rejected = await request(app.getHttpServer()).get('/multi').expect(429);
    expect(rejected.body.message).toContain("'multi-client'");
  });

  it('GET /login: only failures count; after three, the client is locked out for 5 minutes', async () => {
    await start();
    expect(await statuses(app, '/login?password=demo', 5)).toEqual(repeat(200, 5));
    expect(await statuses(app, '/login?password=nope', 3)).toEqual(repeat(401, 3));
    const locked = await request(app.getHttpServer()).get('/login?password=nope').expect(429);
    expect(Number(locked.headers['retry-after'])).toBeGreaterThan(290);
    await request(app.getHttpServer()).get('/login?password=demo').expect(429);
  });

  it('GET /upload: a request costs its ?mb= size, 10 MB per minute', async () => {
    await start();
    await request(app.getHttpServer()).get('/upload?mb=6').expect(200);
    await request(app.getHttpServer()).get('/upload?mb=6').expect(429);
    await request(app.getHttpServer()).get('/upload?mb=4').expect(200);
  });

  it('POST /jobs/:tenant: 3 per 10 s per tenant, decided with consume; a deferred job learns when to retry', async () => {
    await start();
    const run = (tenant: string) => request(app.getHttpServer()).post(`/jobs/${tenant}`).expect(200);
    expect((await run('acme')).body).toEqual({ ran: true, left: 2 });
    await run('acme');
    await run('acme');
    const deferred = (await run('acme')).body as { ran: boolean; retryInMs: number };
    expect(deferred.ran).toBe(false);
    expect(deferred.retryInMs).toBeGreaterThan(0);
    expect(deferred.retryInMs).toBeLessThanOrEqual(10_000);
    expect((await run('globex')).body).toEqual({ ran: true, left: 2 });
  });

  it('GET /login: no unlock without the admin token; the lockout holds through unlock attempts', async () => {
    await start({ ADMIN_TOKEN: 'demo-token' });
    const logins = [];
    const openUnlocks = [];
    const adminUnlocks = [];
    for (let i = 0; i < 30; i += 1) {
      logins.push((await request(app.getHttpServer()).get('/login?password=nope')).status);
      if (i % 2 === 1) {
        // The unlock of 0.2's demo, open to all, is gone; the admin one refuses callers without the token.
        openUnlocks.push((await request(app.getHttpServer()).post('/login/unlock')).status);
        adminUnlocks.push(
          (await request(app.getHttpServer()).post('/admin/login/unlock').send({ ip: '127.0.0.1' })).status,
        );
      }
    }
    expect(logins).toEqual([...repeat(401, 3), ...repeat(429, 27)]);
    await request(app.getHttpServer()).get('/login?password=demo').expect(429);
    expect(openUnlocks).toEqual(repeat(404, 15));
    // Failed authentications: 401 until the address is locked out of the admin endpoints too.
    expect(adminUnlocks).toEqual([...repeat(401, 10), ...repeat(429, 5)]);
  });

  it('POST /admin/login/unlock: with the admin token, reset lifts a client’s /login lockout', async () => {
    await start({ ADMIN_TOKEN: 'demo-token' });
    const unlock = () =>
      request(app.getHttpServer()).post('/admin/login/unlock').set('authorization', 'Bearer demo-token');
    expect(await statuses(app, '/login?password=nope', 3)).toEqual(repeat(401, 3));
    await request(app.getHttpServer()).get('/login?password=demo').expect(429);
    await unlock().send({}).expect(400);
    // supertest connects from 127.0.0.1 (as ::ffff:127.0.0.1 on a dual-stack server: the same client).
    await unlock().send({ ip: '127.0.0.1' }).expect(204);
    await request(app.getHttpServer()).get('/login?password=demo').expect(200);
    // Its failures are gone too: three more before the next lockout.
    expect(await statuses(app, '/login?password=nope', 3)).toEqual(repeat(401, 3));
    await request(app.getHttpServer()).get('/login?password=nope').expect(429);
  });

  it('POST /admin/login/unlock without ADMIN_TOKEN: 404', async () => {
    await start();
    expect(await statuses(app, '/login?password=nope', 3)).toEqual(repeat(401, 3));
    await request(app.getHttpServer()).post('/admin/login/unlock').send({ ip: '127.0.0.1' }).expect(404);
    await request(app.getHttpServer()).get('/login?password=demo').expect(429);
  });
});

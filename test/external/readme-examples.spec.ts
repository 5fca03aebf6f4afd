import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { type BootedApp, boot, compile, createApp, packPackage, pinned } from './consumer-app.js';
import { README_APP_MAIN } from './readme-app-main.js';

/**
 * The README's plans app run for real: its `src/plans.module.ts` and `src/incident.service.ts`
 * blocks, in a fresh app on the packed package, started against a redis-server of its own, and
 * asked what the README's comments say it does. One package, one install, one app for every case:
 * each case counts under customers, addresses or routes of its own.
 */

/** A request as the README's app sees it: from a customer (`id:plan`) and from an address. */
interface From {
  customer?: string;
  address?: string;
}

describe('the README’s plans app, started on the packed package against Redis', () => {
  let redis: RedisServer;
  let app: BootedApp;
  let compiled: string;
  const dirs: string[] = [];

  beforeAll(async () => {
    // The dist/ this run built: consumer.spec.ts proves a build of its own packs and installs.
    const [{ packDir, tarball }, server] = await Promise.all([packPackage({ build: 'run' }), startRedisServer()]);
    dirs.push(packDir);
    redis = server;
    // The README's first install command; checked as `nest new`'s tsconfig checks (skipLibCheck).
    const dir = await createApp('esm', [pinned(['nest-rate-limit', '@nestjs/config', 'ioredis'], tarball)], dirs, {
      only: ['src/plans.module.ts', 'src/incident.service.ts'],
      extra: { 'src/main.ts': README_APP_MAIN },
      skipLibCheck: true,
    });
    // tsc writes the app even when it reports errors: the cases below still say what it does.
    compiled = await compile(dir).then(
      () => 'compiled',
      (error: Error) => error.message,
    );
    app = await boot(dir, { REDIS_URL: redis.url });
  }, 240_000);

  afterAll(async () => {
    app?.process.kill('SIGKILL');
    await redis?.stop();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  const headersOf = ({ customer, address }: From): Record<string, string> => ({
    ...(customer ? { 'x-customer': customer } : {}),
    ...(address ? { 'x-forwarded-for': address } : {}),
  });
  /** A request to the app; one it never answers fails with what the app wrote. */
  const send = (path: string, init: RequestInit) =>
    fetch(`${app.url}${path}`, init).catch((error: Error) => {
      throw new Error(`${init.method ?? 'GET'} ${path}: ${error.message}; the app wrote:\n${app.output()}`);
    });
  const get = (path: string, from: From = {}) => send(path, { headers: headersOf(from) });
  const post = (path: string, body: unknown, from: From = {}) =>
    send(path, {
      method: 'POST',
      headers: { ...headersOf(from), 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
  /** The statuses of `n` requests, one after another. */
  const statuses = async (n: number, send: () => Promise<Response>) => {
    const seen: number[] = [];
    for (let i = 0; i < n; i += 1) {
      const response = await send();
      await response.arrayBuffer();
      seen.push(response.status);
    }
    return seen;
  };
  const limitOf = (response: Response) => Number(response.headers.get('ratelimit-limit'));

  it('compiles with tsc', () => {
    expect(compiled).toBe('compiled');
  });

  it('GET /reports: each plan its own limit (pro 5,000, partner 20,000, none 100), not the default’s 300 per address; one customer’s traffic never refuses another’s', async () => {
    const pro = await get('/reports', { customer: 'alice:pro' });
    expect(pro.status).toBe(200);
    expect(limitOf(pro)).toBe(5_000);
    const partner = await get('/reports', { customer: 'bob:partner' });
    expect(limitOf(partner)).toBe(20_000);
    const none = await get('/reports', { customer: 'carol' });
    expect(limitOf(none)).toBe(100);

    // 300 more from the same address: past the default's 300 a minute, within the pro plan's 5,000.
    expect(new Set(await statuses(300, () => get('/reports', { customer: 'alice:pro' })))).toEqual(new Set([200]));
    const other = await get('/reports', { customer: 'dave' });
    expect(other.status).toBe(200);
    expect(limitOf(other)).toBe(100);
  });

  it('GET /reports/samples, a route without a rule of its own: the default’s 300 a minute per client address', async () => {
    const from = { address: '192.0.2.10' };
    const seen = await statuses(301, () => get('/reports/samples', from));
    expect(seen.slice(0, 300)).toEqual(Array<number>(300).fill(200));
    expect(seen[300]).toBe(429);
    // Another address has a counter of its own.
    expect((await get('/reports/samples', { address: '192.0.2.11' })).status).toBe(200);
  });

  it('POST /reports/completions: a max_tokens beyond the bound is refused (400), not held in flight; one within it is admitted and charged what it used', async () => {
    const from = { customer: 'erin:pro' };
    for (const max_tokens of [1_000_000_000, 'all', 0]) {
      expect((await post('/reports/completions', { max_tokens }, from)).status, String(max_tokens)).toBe(400);
    }
    const admitted = await post('/reports/completions', { max_tokens: 100 }, from);
    expect(admitted.status).toBe(201);
    expect(limitOf(admitted)).toBe(10_000);
    expect(await admitted.json()).toEqual({ text: '…', usage: { total_tokens: 42 } });
  });

  it('IncidentService: the ban, then the override on a tier’s key, each answered and in force; no 500 after a ban already made', async () => {
    const banned = { customer: 'frank:pro', address: '198.51.100.7' };
    expect((await get('/reports', banned)).status).toBe(200);

    const ban = await post('/incident/ban?address=198.51.100.7', {});
    expect(ban.status, await ban.clone().text()).toBe(200);
    // A ban reaches every instance, this one too, through Redis: within a second.
    await until(async () => (await get('/reports', banned)).status === 403, {
      timeoutMs: 2_000,
      what: 'a request from the banned address refused',
    });
    const refused = await get('/reports', banned);
    expect(refused.status).toBe(403);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect((await get('/reports', { customer: 'frank:pro', address: '198.51.100.8' })).status).toBe(200);

    const override = await post('/incident/override?customer=acme&plan=pro&count=20000', {});
    expect(override.status, await override.clone().text()).toBe(200);
    await until(async () => limitOf(await get('/reports', { customer: 'acme:pro' })) === 20_000, {
      timeoutMs: 2_000,
      what: "acme's own limit of 20,000 in force",
    });
    // Another pro customer keeps the plan's.
    expect(limitOf(await get('/reports', { customer: 'grace:pro' }))).toBe(5_000);

    const changes = (await (await post('/incident/changes', {})).json()) as { change: string; by?: string }[];
    expect(changes.map(({ change, by }) => [change, by])).toEqual([
      ['set-override', 'sales'],
      ['ban', 'oncall'],
    ]);
  });
});

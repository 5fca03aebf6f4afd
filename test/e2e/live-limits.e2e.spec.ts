import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DemoProcess, ROOT, startDemoProcess } from '../support/demo-process.js';
import { until } from '../support/poll.js';
import { type RedisServer, freePort, startRedisServer } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';

/**
 * What an operator does during an incident, as the README shows it: three demo processes on one
 * Redis, limits changed with the package's CLI (`nest-rate-limit-limits`, as `npm run limits` runs
 * it), read back over each instance's admin endpoint, and obeyed by the next requests.
 */

const INSTANCES = 3;
const TOKEN = 'test-admin-token';
/** How long a change may take to reach every instance. */
const PROPAGATION_BOUND_MS = 1_000;
const CLI = join(ROOT, 'libs/rate-limit/dist/bin/limits.js');

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** The built CLI (`nest-rate-limit-limits`), with `env` over this process's environment. */
async function runCli(args: readonly string[], env: Record<string, string>): Promise<CliResult> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [CLI, ...args], {
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code: number; stdout: string; stderr: string };
    return { code: failed.code, stdout: failed.stdout, stderr: failed.stderr };
  }
}

describe('limits changed live across three instances (processes)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-live-e2e-'));
  const persisted = ['--dir', dir, '--appendonly', 'yes', '--appendfsync', 'always'];
  let server: RedisServer;
  const demos: DemoProcess[] = [];
  const env = { RATE_LIMIT_PREFIX: uniquePrefix(), ADMIN_TOKEN: TOKEN };

  beforeAll(async () => {
    server = await startRedisServer(persisted);
    await Promise.all(
      Array.from({ length: INSTANCES }, () => startDemoProcess({ ...env, REDIS_URL: server.url }, demos)),
    );
  }, 60_000);

  afterAll(async () => {
    await Promise.all(demos.map((demo) => demo.stop()));
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  function limits(...args: string[]): Promise<CliResult> {
    return runCli(args, { ...env, REDIS_URL: server.url });
  }

  /** The count in force for demo.config on an instance, as its admin endpoint reports it. */
  async function countIn(demo: DemoProcess): Promise<number> {
    const response = await fetch(`${demo.url}/admin/limits/demo.config`, {
      headers: { authorization: `Bearer ${TOKEN}` },
    });
    const entry = (await response.json()) as { rules: { inForce: { count: number } }[] };
    return entry.rules[0].inForce.count;
  }

  async function everyInstanceAt(count: number, what: string): Promise<number> {
    const started = performance.now();
    await until(async () => (await Promise.all(demos.map(countIn))).every((n) => n === count), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what,
    });
    return performance.now() - started;
  }

  const statusOf = async (demo: DemoProcess) => (await fetch(`${demo.url}/config`)).status;

  it('a set reaches every instance within a second; a bad value is refused; a delete falls back', async () => {
    expect(await Promise.all(demos.map(countIn))).toEqual([10, 10, 10]);
    const set = await limits('set', 'demo.config', 'count=3');
    expect(set.code).toBe(0);
    expect(JSON.parse(set.stdout)).toMatchObject({ configKey: 'demo.config', written: { count: 3 } });
    expect(await everyInstanceAt(3, 'count 3 on every instance')).toBeLessThan(PROPAGATION_BOUND_MS);
    // One counter for the route, shared: 3 admitted across the instances, then 429.
    const answers = [];
    for (let i = 0; i < 5; i += 1) answers.push(await statusOf(demos[i % INSTANCES]));
    expect(answers).toEqual([200, 200, 200, 429, 429]);

    const bad = await limits('set', 'demo.config', 'count=-1');
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/config key 'demo.config': 'count' must be a positive whole number, got "-1"/);
    const typo = await limits('set', 'demo.cnofig', 'count=5');
    expect(typo.code).toBe(2);
    expect(typo.stderr).toMatch(/no rule reads config key "demo.cnofig"/);
    expect(await Promise.all(demos.map(countIn))).toEqual([3, 3, 3]);

    expect((await limits('delete', 'demo.config')).code).toBe(0);
    expect(await everyInstanceAt(10, 'the decorator count on every instance')).toBeLessThan(PROPAGATION_BOUND_MS);
  });

  it('a Redis restart in between loses nothing: values kept while it is away, new ones after', async () => {
    expect((await limits('set', 'demo.config', 'count=4', 'window=30s')).code).toBe(0);
    await everyInstanceAt(4, 'count 4 on every instance');
    const port = server.port;
    await server.stop();
    expect(await Promise.all(demos.map(countIn))).toEqual([4, 4, 4]);
    server = await startRedisServer(persisted, port);
    // Kept by Redis (AOF) and by every instance: still 4 once they are back.
    const get = await limits('get', 'demo.config');
    expect(JSON.parse(get.stdout)).toMatchObject({ written: { count: 4, window: 30_000 } });
    expect((await limits('set', 'demo.config', 'count=6')).code).toBe(0);
    // Re-subscribed after the restart; the bound also covers their reconnect, which ioredis paces.
    await until(async () => (await Promise.all(demos.map(countIn))).every((n) => n === 6), {
      timeoutMs: 10_000,
      intervalMs: 10,
      what: 'count 6 on every instance after the restart',
    });
    expect((await limits('set', 'demo.config', 'count=7')).code).toBe(0);
    expect(await everyInstanceAt(7, 'count 7 on every instance')).toBeLessThan(PROPAGATION_BOUND_MS);
    // The written window stayed: a set changes only the fields it names.
    expect(JSON.parse((await limits('get', 'demo.config')).stdout)).toMatchObject({
      written: { count: 7, window: 30_000 },
    });
  });

  it('the CLI writes a user agent only with the networks it comes from', async () => {
    const bare = await limits('set', 'demo.allow', 'allow.userAgents=kube-probe');
    expect(bare.code).toBe(2);
    expect(bare.stderr).toMatch(/'allow.userAgents\[0\]' is a user agent alone, which any client can send/);
    const paired = await limits('set', 'demo.allow', 'allow.userAgents=kube-probe@10.0.0.0/8+fd00::/8');
    expect(paired.code).toBe(0);
    expect(JSON.parse(paired.stdout)).toMatchObject({
      written: { allow: { userAgents: [{ agent: 'kube-probe', from: ['10.0.0.0/8', 'fd00::/8'] }] } },
    });
    expect((await limits('delete', 'demo.allow')).code).toBe(0);
  });

  it('inspects and resets an identity from the CLI', async () => {
    expect((await limits('delete', 'demo.config')).code).toBe(0);
    await everyInstanceAt(10, 'the decorator count on every instance');
    for (let i = 0; i < 3; i += 1) await fetch(`${demos[i].url}/ip`);
    const inspected = await limits('inspect', 'LimitsController.byIp', '127.0.0.1');
    expect(JSON.parse(inspected.stdout)).toMatchObject({ rule: 'LimitsController.byIp', used: 3, remaining: 2 });
    expect((await limits('reset', 'LimitsController.byIp', '127.0.0.1')).code).toBe(0);
    expect(JSON.parse((await limits('inspect', 'LimitsController.byIp', '127.0.0.1')).stdout)).toMatchObject({
      used: 0,
    });
    const unknown = await limits('inspect', 'NoSuch.rule', 'x');
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/no rule is named "NoSuch.rule" \(rules: \[.*"LimitsController.byIp".*\]\)/);
    const usage = await limits('frobnicate');
    expect(usage.code).toBe(2);
    expect(usage.stderr).toMatch(/unknown command 'frobnicate'/);
  });

  it('a ban from the CLI reaches every instance within a second, and ends; overrides are listed; both logged', async () => {
    const banned = async (demo: DemoProcess) => (await fetch(`${demo.url}/ip`)).status === 403;
    const ban = await limits('ban', 'LimitsController.byIp', '127.0.0.1', 'for=1h');
    expect(ban.code).toBe(0);
    const started = performance.now();
    await until(async () => (await Promise.all(demos.map(banned))).every(Boolean), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what: 'the ban on every instance',
    });
    expect(performance.now() - started).toBeLessThan(PROPAGATION_BOUND_MS);
    const refused = await fetch(`${demos[1].url}/ip`);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(3_500);
    expect(JSON.parse((await limits('bans')).stdout)).toEqual([
      { rule: 'LimitsController.byIp', identity: '127.0.0.1', until: expect.any(String) },
    ]);

    expect((await limits('unban', 'LimitsController.byIp', '127.0.0.1')).code).toBe(0);
    await until(async () => (await Promise.all(demos.map(banned))).every((is) => !is), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what: 'the ban lifted on every instance',
    });

    const override = await limits('set-override', 'demo.config', 'global', 'count=50', 'until=2099-01-01T00:00Z');
    expect(override.code).toBe(2);
    expect(override.stderr).toMatch(/'until' must be a time in the next 365 days/);
    expect((await limits('set-override', 'demo.config', 'global', 'count=50', 'for=1d')).code).toBe(0);
    expect(JSON.parse((await limits('overrides')).stdout)).toEqual([
      { configKey: 'demo.config', identity: 'global', values: { count: 50 }, until: expect.any(String) },
    ]);
    expect((await limits('delete-override', 'demo.config', 'global')).code).toBe(0);
    const changes = JSON.parse((await limits('changes', '4')).stdout) as { change: string; by: string }[];
    expect(changes.map(({ change }) => change)).toEqual(['delete-override', 'set-override', 'unban', 'ban']);
    expect(new Set(changes.map(({ by }) => by)).size).toBe(1);
  });

  it('takes an address or a network from the CLI as the apps count it, by the rules they catalogue; for= needs a unit', async () => {
    const banned = async (demo: DemoProcess) => (await fetch(`${demo.url}/ip`)).status === 403;
    const ban = await limits('ban', 'LimitsController.byIp', '::ffff:127.0.0.1', 'for=1h');
    expect(ban.code).toBe(0);
    expect(JSON.parse(ban.stdout)).toMatchObject({ rule: 'LimitsController.byIp', identity: '127.0.0.1' });
    await until(async () => (await Promise.all(demos.map(banned))).every(Boolean), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what: 'the ban on every instance',
    });
    const unban = await limits('unban', 'LimitsController.byIp', '::FFFF:127.0.0.1');
    expect(JSON.parse(unban.stdout)).toEqual({ unbanned: true });
    await until(async () => (await Promise.all(demos.map(banned))).every((is) => !is), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what: 'the ban lifted on every instance',
    });

    const bare = await limits('ban', '*', '192.0.2.1', 'for=60');
    expect(bare.code).toBe(2);
    expect(bare.stderr).toMatch(/^ban: for=60 has no unit; give one: for=60s, for=60m, for=1h, for=7d/);

    // A network holds for every address in it; an address no client is written as is refused.
    expect(JSON.parse((await limits('ban', 'LimitsController.byIp', '127.0.0.0/8', 'for=1h')).stdout)).toMatchObject({
      identity: '127.0.0.0/8',
    });
    await until(async () => (await Promise.all(demos.map(banned))).every(Boolean), {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 10,
      what: 'the network ban on every instance',
    });
    expect(JSON.parse((await limits('unban', 'LimitsController.byIp', '127.0.0.0/8')).stdout)).toEqual({
      unbanned: true,
    });
    const hex = await limits('ban', 'LimitsController.byIp', '0x7f000001', 'for=1h');
    expect(hex.code).toBe(2);
    expect(hex.stderr).toContain(
      'give an IPv4 address in four decimal parts without leading zeros (203.0.113.7), an IPv6 address (2001:db8::7), or a network of either (203.0.113.0/24, 2001:db8::/48)',
    );
    expect(JSON.parse((await limits('bans')).stdout)).toEqual([]);
  });

  it('the admin endpoints refuse a wrong token', async () => {
    const response = await fetch(`${demos[0].url}/admin/limits`, { headers: { authorization: 'Bearer nope' } });
    expect(response.status).toBe(401);
  });

  it('refuses a window without a unit, saying what it read and how to write it', async () => {
    const bare = await limits('set', 'demo.config', 'count=5', 'window=60');
    expect(bare.code).toBe(2);
    expect(bare.stderr).toMatch(
      /^set: window=60 has no unit \(a bare number would be 60 ms\); give one: window=60s, window=500ms, window=1m\n/,
    );
    expect((JSON.parse((await limits('get', 'demo.config')).stdout) as { written?: unknown }).written).toBeUndefined();
    const set = await limits('set', 'demo.config', 'window=60s');
    expect(JSON.parse(set.stdout)).toMatchObject({ written: { window: 60_000 } });
    expect((await limits('delete', 'demo.config')).code).toBe(0);
  });
});

describe('the limits CLI without a Redis to reach', () => {
  it('names the address it tried and what to check, and exits 1', async () => {
    const port = await freePort();
    const result = await runCli(['list'], { REDIS_URL: `redis://127.0.0.1:${port}` });
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      `Cannot reach Redis at 127.0.0.1:${port} (from REDIS_URL): is it running, and is REDIS_URL the address the apps use (with their password, or rediss:// for TLS)?\n`,
    );
  });
});

describe('npm run limits', () => {
  it('runs the built CLI without building again, so a running demo keeps its dist/', async () => {
    const built = statSync(CLI).mtimeMs;
    // A refusal needs no Redis: the arguments are checked first.
    const result = await promisify(execFile)('npm', ['run', '--silent', 'limits', '--', 'set', 'demo.config'], {
      cwd: ROOT,
    }).catch((error: { code: number; stderr: string }) => error);
    expect('code' in result && result.code).toBe(2);
    expect(statSync(CLI).mtimeMs).toBe(built);
  });
});

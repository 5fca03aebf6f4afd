import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Cluster, type Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rateLimitKeys, ruleKeyId } from 'nest-rate-limit/store';
import { plantFixedWindow } from '../support/inspect.js';
import { type RedisCluster, type RedisServer, startRedisCluster, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

const run = promisify(execFile);

/** Runs `npm run audit:keys` as a person would; resolves with its exit code and output. */
async function auditCli(env: Record<string, string>, args: string[] = []) {
  try {
    const { stdout } = await run('npm', ['run', '-s', 'audit:keys', '--', ...args], {
      env: { ...process.env, ...env },
      timeout: 60_000,
    });
    return { code: 0, stdout };
  } catch (error) {
    const failed = error as { code: number; stdout: string };
    return { code: failed.code, stdout: failed.stdout };
  }
}

describe('auditing keys without a TTL', () => {
  let server: RedisServer;
  let redis: Redis;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
  });

  afterAll(() => server?.stop());

  it('reports the planted keys, repairs them, and leaves other keys alone (RateLimitKeyAudit.run)', async () => {
    const prefix = uniquePrefix();
    const { store, keyAudit, close } = await createStore({ redis: server.url, keyPrefix: prefix });
    try {
      await store.consume([hit(`${prefix}:{a}:r:fw`, { limit: 5, windowMs: 60_000 })]);
      await plantFixedWindow(redis, `${prefix}:{b}:r:fw`, { start: 1, count: 9 });
      await redis.set(`${prefix}:{c}:old`, '42');
      await redis.set(`other:{d}:x`, '1');
      // The live limits (RedisConfigCentre) are kept without a TTL by design: no finding.
      await redis.hset(`${prefix}:config`, 'orders.list', '{"count":5}');

      const report = await keyAudit.run();
      expect(report.scanned).toBe(4);
      expect(report.withoutTtl.sort()).toEqual([`${prefix}:{b}:r:fw`, `${prefix}:{c}:old`]);
      expect(report.repaired).toBe(0);
      expect(await redis.pttl(`${prefix}:{b}:r:fw`)).toBe(-1);

      const repaired = await keyAudit.run({ repairTtlMs: 3_600_000 });
      expect(repaired.repaired).toBe(2);
      expect(await redis.pttl(`${prefix}:{c}:old`)).toBeGreaterThan(3_500_000);
      expect(await redis.pttl('other:{d}:x')).toBe(-1);
      expect((await keyAudit.run()).withoutTtl).toEqual([]);
      expect(await redis.pttl(`${prefix}:config`)).toBe(-1);
    } finally {
      await close();
    }
  });

  it('names the rule of each key listed where the rule catalogue knows it', async () => {
    const prefix = uniquePrefix();
    const { keyAudit, close } = await createStore({ redis: server.url, keyPrefix: prefix });
    try {
      const known = rateLimitKeys(prefix, 'PingController.ping', '203.0.113.7', 'fixed-window');
      const unknown = rateLimitKeys(prefix, 'GoneController.gone', '203.0.113.7', 'fixed-window');
      await redis.set(known.key, '3');
      await redis.set(known.blockKey, '1');
      await redis.set(unknown.key, '3');
      // As RateLimitManagementService publishes it with RedisConfigCentre: rule name to its options.
      await redis.hset(`${prefix}:config:rules`, 'PingController.ping', '{}', 'other', '{}');
      await redis.pexpire(`${prefix}:config:rules`, 60_000);

      const report = await keyAudit.run();
      expect(report.withoutTtl.sort()).toEqual([known.key, known.blockKey, unknown.key].sort());
      expect(report.rules).toEqual({ [ruleKeyId('PingController.ping')]: 'PingController.ping' });

      const cli = await auditCli({ REDIS_URL: server.url, RATE_LIMIT_PREFIX: prefix });
      expect(cli.stdout).toContain(`no TTL: ${known.key} (rule PingController.ping)`);
      expect(cli.stdout).toContain(`no TTL: ${unknown.key}\n`);
    } finally {
      await close();
    }
  });

  it('npm run audit:keys reports with exit 1, and --repair fixes with exit 0', async () => {
    const prefix = uniquePrefix();
    await redis.set(`${prefix}:{x}:legacy`, '7');
    const env = { REDIS_URL: server.url, RATE_LIMIT_PREFIX: prefix };

    const report = await auditCli(env);
    expect(report.code).toBe(1);
    expect(report.stdout).toContain(`no TTL: ${prefix}:{x}:legacy`);
    expect(report.stdout).toContain(`1 keys under '${prefix}:', 1 without a TTL`);

    const repair = await auditCli(env, ['--repair', '--ttl', '2h']);
    expect(repair.code).toBe(0);
    expect(repair.stdout).toContain('1 given a TTL of 2h');
    expect(await redis.pttl(`${prefix}:{x}:legacy`)).toBeGreaterThan(7_000_000);
  });
});

describe('auditing keys on a 3-master cluster', () => {
  let cluster: RedisCluster;

  beforeAll(async () => {
    cluster = await startRedisCluster(3);
  });

  afterAll(() => cluster?.stop());

  it('scans every master', async () => {
    const prefix = uniquePrefix();
    const client = new Cluster(cluster.startupNodes);
    try {
      const keys = ['alice', 'bob', 'carol', 'dave', 'erin', 'frank'].map((id) => `${prefix}:{${id}}:legacy`);
      for (const key of keys) await client.set(key, '1');
      const owners = new Set(
        await Promise.all(keys.map(async (key) => Math.floor(Number(await client.cluster('KEYSLOT', key)) / 5462))),
      );
      expect(owners.size).toBeGreaterThan(1);
      const { store, keyAudit, close } = await createStore({
        redis: { cluster: cluster.startupNodes },
        keyPrefix: prefix,
      });
      try {
        expect(store).toBeDefined();
        const report = await keyAudit.run({ repairTtlMs: 60_000 });
        expect(report.withoutTtl.sort()).toEqual([...keys].sort());
        expect(report.repaired).toBe(keys.length);
      } finally {
        await close();
      }
    } finally {
      client.disconnect();
    }
  });
});

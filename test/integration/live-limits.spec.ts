import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Controller, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { RateLimit, RateLimitConfigurationError, RateLimiterService } from 'nest-rate-limit';
import {
  RateLimitConfigCentre,
  RateLimitManagementService,
  type RateLimitOverride,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import { RedisService } from 'nest-rate-limit/store';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import {
  type RedisSentinelSet,
  type RedisServer,
  startRedisSentinelSet,
  startRedisServer,
} from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

@Controller('live')
class LiveController {
  @Get('tuned')
  @RateLimit({ count: 10, window: '1m', configKey: 'live.tuned', by: 'global' })
  tuned() {
    return {};
  }

  @Get('leased')
  @RateLimit({ count: 50, window: '1m', configKey: 'live.leased', by: 'global', lease: 5 })
  leased() {
    return {};
  }
}

/** How long a change may take to reach another instance. */
const PROPAGATION_BOUND_MS = 1_000;

describe('live limits in Redis (RedisConfigCentre), two instances', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-live-'));
  let server: RedisServer;
  let redis: Redis;
  let prefix: string;
  let apps: INestApplication[] = [];
  let logs: LogCapture[] = [];

  // Persisted (AOF), as production keeps its limits: a restart must not lose them.
  const persisted = ['--dir', dir, '--appendonly', 'yes', '--appendfsync', 'always'];

  beforeAll(async () => {
    server = await startRedisServer(persisted);
    redis = server.client();
  });

  afterEach(async () => {
    await Promise.all(apps.map((app) => app.close()));
    apps = [];
    logs = [];
  });

  afterAll(async () => {
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  async function instances(count: number, refreshMs = 60_000, keyPrefix = uniquePrefix()) {
    prefix = keyPrefix;
    for (let i = 0; i < count; i += 1) {
      const logger = new LogCapture();
      logs.push(logger);
      apps.push(
        await createTestApp({
          controllers: [LiveController],
          logger,
          rateLimit: {
            redis: server.url,
            keyPrefix: prefix,
            configCentre: RedisConfigCentre,
            extensions: [rateLimitManagement()],
            liveConfig: { refreshMs },
            storeErrors: { circuitBreaker: false },
          },
        }),
      );
    }
    return apps.map((app) => app.get(RateLimitManagementService));
  }

  /** The count in force for `live.tuned` on an instance: what its config centre holds, read without Redis. */
  function countOn(app: INestApplication, configKey = 'live.tuned'): unknown {
    return app.get(RateLimitConfigCentre).get(configKey)?.count;
  }

  it('a set on one instance is in force on the other within a second, without a restart', async () => {
    const [a] = await instances(2);
    expect(await statuses(apps[1], '/live/tuned', 11)).toEqual([...Array(10).fill(200), 429]);
    const started = performance.now();
    const entry = await a.set('live.tuned', { count: 12 });
    expect(entry.written).toEqual({ count: 12 });
    expect(entry.rules[0].inForce).toMatchObject({ count: 12, windowMs: 60_000 });
    await until(() => countOn(apps[1]) === 12, {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 5,
      what: 'count 12 on B',
    });
    expect(performance.now() - started).toBeLessThan(PROPAGATION_BOUND_MS);
    // The next requests obey it: 2 more in the same window, on either instance.
    const next = await request(apps[1].getHttpServer()).get('/live/tuned');
    expect(next.status).toBe(200);
    expect(next.headers['ratelimit-limit']).toBe('12');
    expect(await statuses(apps[0], '/live/tuned', 2)).toEqual([200, 429]);
  });

  it('refuses a bad write before writing it, naming the key and the field', async () => {
    const [a] = await instances(1);
    await a.set('live.tuned', { count: 20 });
    await expect(a.set('live.tuned', { count: 'lots' })).rejects.toThrow(
      /'live.tuned': 'count' must be a positive whole number, got "lots"/,
    );
    // Checked with the rule as bootstrap checks its decorator: a lease on an algorithm without one.
    await expect(a.set('live.leased', { algorithm: 'gcra' })).rejects.toThrow(
      /rule LiveController.leased on LiveController.leased: 'lease' applies only to the 'fixed-window' algorithm/,
    );
    // A count cut below the lease holds (a lease never admits past the count in force).
    expect((await a.set('live.leased', { count: 3 })).rules[0].inForce.count).toBe(3);
    await expect(a.set('live.tuned', { cnt: 5 } as never)).rejects.toThrow(/'cnt' is not a setting/);
    await expect(a.set('live.tpyo', { count: 5 })).rejects.toThrow(
      /no rule reads config key "live.tpyo" \(config keys: \["live.leased","live.tuned"\]\)/,
    );
    await expect(a.set('live.tuned', { count: 0 })).rejects.toBeInstanceOf(RateLimitConfigurationError);
    expect(await redis.hgetall(`${prefix}:config`)).toEqual({
      'live.tuned': JSON.stringify({ count: 20 }),
      'live.leased': JSON.stringify({ count: 3 }),
    });
  });

  it('refuses a bad value written behind its back, keeping the last good one, with a sampled warning', async () => {
    const [a] = await instances(2);
    await a.set('live.tuned', { count: 7 });
    await until(() => countOn(apps[1]) === 7, { timeoutMs: PROPAGATION_BOUND_MS, intervalMs: 5, what: 'count 7 on B' });
    const centres = apps.map((app) => app.get(RateLimitConfigCentre) as RedisConfigCentre);
    const refusedEverywhere = (n: number) =>
      until(() => centres.every((centre) => centre.state.refused === n), {
        timeoutMs: PROPAGATION_BOUND_MS,
        intervalMs: 5,
        what: `refusal ${n} on both instances`,
      });
    const writeBehindItsBack = async (text: string) => {
      await redis.hset(`${prefix}:config`, 'live.tuned', text);
      await redis.publish(`${prefix}:config:changed`, 'live.tuned');
    };
    // Nest's Logger is one per process: both instances' lines land in the capture created last.
    const refusals = () => logs.at(-1)!.at('warn', /Refused limits/);
    await writeBehindItsBack('{"count":"zero"}');
    await refusedEverywhere(1);
    expect(apps.map((app) => countOn(app))).toEqual([7, 7]);
    expect(refusals()).toEqual(
      Array(2).fill(
        expect.stringMatching(
          /^Refused limits \{"count":"zero"\} for config key 'live.tuned' \(.*'count' must be a positive whole number, got "zero"\); its last good values \{"count":7\} stay/,
        ),
      ),
    );
    await writeBehindItsBack('{"count":50,"window":"5 parsecs"}');
    await refusedEverywhere(2);
    await writeBehindItsBack('not json');
    await refusedEverywhere(3);
    // One line per key per interval on each instance, however many values arrive; the rest are
    // counted for the next line.
    expect(refusals()).toHaveLength(2);
    expect(apps.map((app) => countOn(app))).toEqual([7, 7]);
    expect((await request(apps[1].getHttpServer()).get('/live/tuned')).headers['ratelimit-limit']).toBe('7');
  });

  it('a delete falls back to the decorator on every instance', async () => {
    const [a] = await instances(2);
    await a.set('live.tuned', { count: 3 });
    await until(() => countOn(apps[1]) === 3, { timeoutMs: PROPAGATION_BOUND_MS, intervalMs: 5, what: 'count 3 on B' });
    expect(await a.delete('live.tuned')).toBe(true);
    await until(() => countOn(apps[1]) === undefined, {
      timeoutMs: PROPAGATION_BOUND_MS,
      intervalMs: 5,
      what: 'the delete on B',
    });
    expect((await request(apps[1].getHttpServer()).get('/live/tuned')).headers['ratelimit-limit']).toBe('10');
    expect(await a.delete('live.tuned')).toBe(false);
  });

  it('a value written without an announcement arrives with the periodic read', async () => {
    await instances(1, 200);
    await redis.hset(`${prefix}:config`, 'live.tuned', JSON.stringify({ count: 4 }));
    await until(() => countOn(apps[0]) === 4, { timeoutMs: 5_000, intervalMs: 20, what: 'the periodic read' });
  });

  it('changes mode and algorithm live: shadow never rejects, off counts nothing, a new algorithm starts afresh', async () => {
    const [a] = await instances(1);
    await a.set('live.tuned', { count: 2, mode: 'shadow' });
    expect(await statuses(apps[0], '/live/tuned', 4)).toEqual([200, 200, 200, 200]);
    expect(await a.inspect('LiveController.tuned', 'any')).toMatchObject({ used: 2, mode: 'shadow' });
    await a.set('live.tuned', { mode: 'off' });
    expect(await statuses(apps[0], '/live/tuned', 2)).toEqual([200, 200]);
    expect((await a.inspect('LiveController.tuned', 'any')).used).toBe(2);
    await a.set('live.tuned', { mode: 'enforce' });
    expect(await statuses(apps[0], '/live/tuned', 1)).toEqual([429]);
    const entry = await a.set('live.tuned', { algorithm: 'sliding-window' });
    expect(entry.written).toEqual({ count: 2, mode: 'enforce', algorithm: 'sliding-window' });
    expect(await statuses(apps[0], '/live/tuned', 3)).toEqual([200, 200, 429]);
    expect(await a.inspect('LiveController.tuned', 'any')).toMatchObject({ algorithm: 'sliding-window', used: 2 });
    // A reset clears the counters under every algorithm.
    await a.set('live.tuned', { algorithm: null });
    await a.reset('LiveController.tuned', 'any');
    expect((await a.inspect('LiveController.tuned', 'any')).used).toBe(0);
    await a.set('live.tuned', { algorithm: 'sliding-window' });
    expect((await a.inspect('LiveController.tuned', 'any')).used).toBe(0);
  });

  it('keeps serving its values while Redis is away, and after a restart takes new ones', async () => {
    const [a] = await instances(2);
    await a.set('live.tuned', { count: 5 });
    await until(() => countOn(apps[1]) === 5, { timeoutMs: PROPAGATION_BOUND_MS, intervalMs: 5, what: 'count 5 on B' });
    const port = server.port;
    await server.stop();
    // Away: still in force, and requests are decided (by the fallback) under it.
    expect(countOn(apps[0])).toBe(5);
    expect(countOn(apps[1])).toBe(5);
    expect((await request(apps[1].getHttpServer()).get('/live/tuned')).status).toBe(200);
    server = await startRedisServer(persisted, port);
    redis = server.client();
    // The instances re-subscribe and read everything again; the persisted value is still there.
    const centres = apps.map((app) => app.get(RateLimitConfigCentre) as RedisConfigCentre);
    await until(() => centres.every((centre) => centre.state.inSync), {
      timeoutMs: 10_000,
      what: 'both back in sync',
    });
    expect(countOn(apps[1])).toBe(5);
    const started = performance.now();
    await a.set('live.tuned', { count: 6 });
    await until(() => countOn(apps[1]) === 6, { timeoutMs: PROPAGATION_BOUND_MS, intervalMs: 5, what: 'count 6 on B' });
    expect(performance.now() - started).toBeLessThan(PROPAGATION_BOUND_MS);
  });
});

describe('live limits in Redis: what a centre holds, reads and runs', () => {
  let server: RedisServer;
  let redis: Redis;
  let prefix: string;
  let apps: INestApplication[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
  });

  afterEach(async () => {
    vi.restoreAllMocks();
    await Promise.all(apps.map((app) => app.close()));
    apps = [];
  });

  afterAll(() => server.stop());

  async function instance(refreshMs: number, keyPrefix = uniquePrefix()) {
    prefix = keyPrefix;
    const app = await createTestApp({
      controllers: [LiveController],
      rateLimit: {
        redis: server.url,
        keyPrefix: prefix,
        configCentre: RedisConfigCentre,
        extensions: [rateLimitManagement()],
        liveConfig: { refreshMs },
        storeErrors: { circuitBreaker: false },
      },
    });
    apps.push(app);
    return {
      app,
      admin: app.get(RateLimitManagementService),
      centre: app.get(RateLimitConfigCentre) as RedisConfigCentre,
    };
  }

  /** The commands an ioredis client is asked to send, by name, counted from now (sent or not). */
  function commandsOf(app: INestApplication): (...names: string[]) => number {
    const sent = vi.spyOn(app.get(RedisService).client, 'sendCommand');
    return (...names) =>
      sent.mock.calls.filter(([command]) => names.includes((command as { name: string }).name)).length;
  }

  const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  it('created from its class, runs each lifecycle hook once: one re-read per refreshMs, none after close', async () => {
    const bootstraps = vi.spyOn(RedisConfigCentre.prototype, 'onApplicationBootstrap');
    const shutdowns = vi.spyOn(RedisConfigCentre.prototype, 'onApplicationShutdown');
    const refreshMs = 100;
    const { app, centre } = await instance(refreshMs);
    expect(bootstraps).toHaveBeenCalledTimes(1);
    await until(() => centre.state.inSync, { timeoutMs: 5_000, what: 'in sync' });
    const reads = commandsOf(app);
    const started = performance.now();
    await pause(10 * refreshMs);
    // One timer: at most one re-read per refreshMs elapsed (two timers read twice as often).
    const elapsed = performance.now() - started;
    expect(reads('hgetall', 'hmget', 'hlen')).toBeGreaterThan(0);
    expect(reads('hgetall', 'hmget', 'hlen')).toBeLessThanOrEqual(Math.floor(elapsed / refreshMs) + 1);
    await app.close();
    apps = [];
    expect(shutdowns).toHaveBeenCalledTimes(1);
    // Nothing of the centre runs after close: no re-read asks the closed client for anything.
    const afterClose = reads('hgetall', 'hmget', 'hlen', 'hget');
    await pause(5 * refreshMs);
    expect(reads('hgetall', 'hmget', 'hlen', 'hget')).toBe(afterClose);
  });

  it('holds and reads only the keys its rules read, however many other fields the hash holds; list is bounded', async () => {
    const keyPrefix = uniquePrefix();
    const hash = `${keyPrefix}:config`;
    const junk = 50_000;
    for (let from = 0; from < junk; from += 5_000) {
      const fields = Array.from({ length: 5_000 }, (_, i) => [`junk.${from + i}`, '{"count":5}']).flat();
      await redis.hset(hash, ...fields);
    }
    await redis.hset(hash, 'live.tuned', JSON.stringify({ count: 4 }));
    const { admin, centre } = await instance(100, keyPrefix);
    // From here: the startup's own calls (the access probe runs every command of the scripts) aside.
    await redis.config('RESETSTAT');
    const reloads = centre.state.reloads;
    await until(() => centre.state.reloads >= reloads + 2, { timeoutMs: 5_000, what: 'two periodic re-reads' });
    expect(centre.held()).toEqual(new Map([['live.tuned', { count: 4 }]]));
    expect(centre.state.keys).toBe(1);
    // The re-read asks for the rules' keys by name; the hash is never read whole.
    const stats = await redis.info('commandstats');
    expect(stats).not.toMatch(/cmdstat_hgetall:/);
    expect(countOf(stats, 'hmget')).toBeGreaterThanOrEqual(2);
    // An announcement of a key no rule of this app reads costs it nothing.
    await redis.publish(`${keyPrefix}:config:changed`, 'junk.1');
    await redis.hset(hash, 'live.tuned', JSON.stringify({ count: 6 }));
    await redis.publish(`${keyPrefix}:config:changed`, 'live.tuned');
    await until(() => centre.get('live.tuned')?.count === 6, { timeoutMs: 1_000, intervalMs: 5, what: 'count 6' });
    expect(countOf(await redis.info('commandstats'), 'hget')).toBe(1);
    // The rules' keys listed in full; of the others, a bounded number.
    const listed = await admin.list();
    expect(listed.filter((entry) => entry.rules.length > 0).map((entry) => entry.configKey)).toEqual([
      'live.leased',
      'live.tuned',
    ]);
    expect(listed.find((entry) => entry.configKey === 'live.tuned')?.written).toEqual({ count: 6 });
    expect(listed.length).toBeLessThanOrEqual(2 + 100);
  });

  it("holds a key a rule given to consume reads from its first use on, and reads it with the rules' keys", async () => {
    const { app, centre } = await instance(100);
    await redis.hset(`${prefix}:config`, 'jobs.live', JSON.stringify({ count: 2 }));
    const jobs = { name: 'jobs', count: 5, window: '1m', configKey: 'jobs.live', by: 'global' as const };
    const limiter = app.get(RateLimiterService);
    // Its first use makes it known (answered with the rule's own values, while it is read).
    await limiter.consume(jobs, 'x', 0);
    await until(() => centre.get('jobs.live')?.count === 2, { timeoutMs: 1_000, intervalMs: 5, what: 'jobs.live' });
    const admitted = [];
    for (let i = 0; i < 3; i += 1) admitted.push((await limiter.consume(jobs, 'x')).allowed);
    expect(admitted).toEqual([true, true, false]);
    // Read again with the rules' keys from now on.
    await redis.hset(`${prefix}:config`, 'jobs.live', JSON.stringify({ count: 3 }));
    await until(() => centre.get('jobs.live')?.count === 3, {
      timeoutMs: 5_000,
      what: 'the periodic read of jobs.live',
    });
  });

  it('a config key of the wrong type is out of sync, and a write says which key holds what', async () => {
    const { admin, centre } = await instance(100);
    const hash = `${prefix}:config`;
    await until(() => centre.state.inSync, { timeoutMs: 5_000, what: 'in sync' });
    await redis.set(hash, 'not a hash');
    await until(() => !centre.state.inSync, { timeoutMs: 5_000, what: 'out of sync on a string' });
    await expect(admin.set('live.tuned', { count: 5 })).rejects.toThrow(
      new RateLimitConfigurationError(
        `Redis key '${hash}' holds a string, not the hash of live limits: nothing was read or written; delete it (or choose another keyPrefix) and write the limits again`,
      ),
    );
    await redis.del(hash);
    await redis.rpush(hash, 'x');
    await expect(admin.set('live.tuned', { count: 5 })).rejects.toThrow(
      /Redis key '.*:config' holds a list, not the hash/,
    );
    expect(centre.state.inSync).toBe(false);
    await redis.del(hash);
    await until(() => centre.state.inSync, { timeoutMs: 5_000, what: 'back in sync' });
    expect((await admin.set('live.tuned', { count: 5 })).written).toEqual({ count: 5 });
  });

  it("refuses '__proto__', 'constructor' and 'prototype' as fields, writing nothing", async () => {
    const { admin } = await instance(60_000);
    // As a JSON body arrives (the demo's PATCH): '__proto__' is an own field there.
    for (const body of [
      '{"__proto__":{"mode":"off"}}',
      '{"count":3,"__proto__":{"mode":"off"}}',
      '{"constructor":{"mode":"off"}}',
      '{"prototype":{"mode":"off"}}',
    ]) {
      const field = /"(__proto__|constructor|prototype)"/.exec(body)![1];
      await expect(admin.set('live.tuned', JSON.parse(body) as RateLimitOverride)).rejects.toThrow(
        `'${field}' is not a setting`,
      );
    }
    expect(await redis.hgetall(`${prefix}:config`)).toEqual({});
    expect((await admin.get('live.tuned')).rules[0].inForce.mode).toBe('enforce');
  });

  it('refuses a window past the longest one, 365 days', async () => {
    const { admin } = await instance(60_000);
    await expect(admin.set('live.tuned', { window: Number.MAX_SAFE_INTEGER })).rejects.toThrow(
      /'window' must be a positive duration of at most 365 days/,
    );
    await expect(admin.set('live.tuned', { window: '366d' })).rejects.toBeInstanceOf(RateLimitConfigurationError);
    expect((await admin.set('live.tuned', { window: '365d' })).rules[0].inForce.windowMs).toBe(365 * 86_400_000);
  });
});

/** Calls of one command since the last CONFIG RESETSTAT, from INFO commandstats. */
function countOf(commandstats: string, command: string): number {
  return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(commandstats)?.[1] ?? 0);
}

describe('live limits through Redis Sentinel', () => {
  let set: RedisSentinelSet;
  const apps: INestApplication[] = [];

  beforeAll(async () => {
    set = await startRedisSentinelSet();
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await set?.stop();
  });

  it('follows a failover: the values stay in force, and a write after it reaches every instance', async () => {
    const prefix = uniquePrefix();
    for (let i = 0; i < 2; i += 1) {
      apps.push(
        await createTestApp({
          controllers: [LiveController],
          rateLimit: {
            redis: { sentinels: set.sentinelAddresses, name: set.name },
            keyPrefix: prefix,
            configCentre: RedisConfigCentre,
            extensions: [rateLimitManagement()],
            liveConfig: { refreshMs: 60_000 },
            storeErrors: { timeoutMs: 1_000 },
          },
        }),
      );
    }
    const [a] = apps.map((app) => app.get(RateLimitManagementService));
    const centres = apps.map((app) => app.get(RateLimitConfigCentre) as RedisConfigCentre);
    const countOn = (i: number) => centres[i].get('live.tuned')?.count;
    await a.set('live.tuned', { count: 7 });
    await until(() => countOn(1) === 7, { timeoutMs: 1_000, intervalMs: 5, what: 'count 7 on B' });
    // This test is about following the master, not about lost writes: let the write replicate.
    expect(await set.master.client().call('WAIT', '1', '5000')).toBe(1);

    await set.sentinels[0].client().call('SENTINEL', 'FAILOVER', set.name);
    const replica = set.replica.client();
    await until(async () => (await replica.info('replication')).includes('role:master'), {
      timeoutMs: 15_000,
      what: 'the replica becoming the master',
    });
    // Through the switch, both instances keep the values they hold.
    expect([countOn(0), countOn(1)]).toEqual([7, 7]);
    // Once the instances have followed the sentinels to the new master, a write goes through and
    // its announcement reaches the other one (re-subscribed there).
    await until(
      async () =>
        centres.every((centre) => centre.state.inSync) &&
        (await a.set('live.tuned', { count: 8 }).then(
          () => true,
          () => false,
        )),
      { timeoutMs: 20_000, what: 'a write on the new master' },
    );
    await until(() => countOn(1) === 8, { timeoutMs: 1_000, intervalMs: 5, what: 'count 8 on B' });
    expect(await replica.hget(`${prefix}:config`, 'live.tuned')).toBe(JSON.stringify({ count: 8 }));
  });
});

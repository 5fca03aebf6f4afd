import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { RateLimit } from 'nest-rate-limit';
import {
  RateLimitConfigCentre,
  RateLimitManagementService,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import { RateLimitHealthIndicator, rateLimitHealth } from 'nest-rate-limit/ops';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { fill } from '../support/fill-redis.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/*
 * Bans, overrides and live limits are an operator's decisions, held in memory by every instance and
 * kept in Redis. A Redis that loses them (restarted without persistence, or evicting under
 * maxmemory) must not take them from the instances: those that hold them write them back, with
 * what is left of their time, and say so in their logs and health. A lift stays lifted.
 */

const tenantOf = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'];

@Controller()
class ApiController {
  /** 2 a minute per client address; live values under 'search'. */
  @Get('search')
  @RateLimit({ count: 2, window: '1m', configKey: 'search' })
  search() {
    return 'found';
  }

  /** 3 a minute per tenant; live values under 'exports'. */
  @Get('exports')
  @RateLimit({ count: 3, window: '1m', configKey: 'exports', by: tenantOf })
  exports() {
    return 'exported';
  }
}

const BANNED = '203.0.113.9';
/** Banned before the loss, lifted after it: Redis is back, the instances may still hold it. */
const LIFTED_AFTER = '198.51.100.7';
/** Banned and lifted before the loss: no instance holds it. */
const LIFTED_BEFORE = '198.51.100.8';
const from = (address: string) => ({ 'X-Forwarded-For': address });

describe('controls Redis lost', () => {
  let server: RedisServer | undefined;
  let apps: INestApplication[] = [];
  let logs: LogCapture[] = [];

  afterEach(async () => {
    await Promise.all(apps.map((app) => app.close()));
    apps = [];
    logs = [];
    await server?.stop();
    server = undefined;
  });

  async function instances(urls: readonly string[], keyPrefix: string, refreshMs: number) {
    for (const url of urls) {
      const logger = new LogCapture();
      logs.push(logger);
      apps.push(
        await createTestApp({
          controllers: [ApiController],
          trustProxy: true,
          logger,
          rateLimit: {
            redis: url,
            keyPrefix,
            configCentre: RedisConfigCentre,
            extensions: [rateLimitManagement(), rateLimitHealth()],
            liveConfig: { refreshMs },
            storeErrors: { circuitBreaker: false },
          },
        }),
      );
    }
    return apps.map((app) => app.get(RateLimitManagementService));
  }

  /** What an instance enforces now, seen through HTTP: the ban, the override and the live limit. */
  async function enforced(app: INestApplication) {
    const http = () => request(app.getHttpServer());
    return {
      banned: (await http().get('/search').set(from(BANNED))).status,
      override: (await http().get('/exports').set('x-tenant', 'acme')).headers['ratelimit-limit'],
      limit: (await http().get('/search').set(from('192.0.2.1'))).headers['ratelimit-limit'],
    };
  }

  /** What Redis holds of the controls: the identities banned, those overridden, the live limit of 'search'. */
  async function inRedis(redis: Redis, keyPrefix: string) {
    const identities = async (key: string) =>
      (await redis.zrange(key, '0', '-1')).flatMap((member) =>
        // Entries only: the marks of lifts start otherwise.
        member.startsWith('[') ? [(JSON.parse(member) as string[])[1]] : [],
      );
    return {
      bans: (await identities(`${keyPrefix}:config:bans`)).sort(),
      overrides: await identities(`${keyPrefix}:config:overrides`),
      limit: await redis.hget(`${keyPrefix}:config`, 'search'),
    };
  }

  const reloadsOf = (app: INestApplication) => (app.get(RateLimitConfigCentre) as RedisConfigCentre).state.reloads;

  it('a Redis restarted empty: every instance still enforces them, they are back in Redis, a lift stays lifted', async () => {
    // A user that may not subscribe: the second instance hears no news, and learns of changes (a
    // lift) only from its reads, every 300 ms. Given as an argument, it is there after the restart.
    const deaf = ['--user', 'deaf', 'on', '>secret', '~*', '&*', '+@all', '-subscribe'];
    server = await startRedisServer(deaf);
    const keyPrefix = uniquePrefix();
    const deafUrl = (port: number) => `redis://deaf:secret@127.0.0.1:${port}`;
    const [a] = await instances([server.url, deafUrl(server.port)], keyPrefix, 300);
    await a.ban('*', BANNED, '1h', { by: 'oncall' });
    await a.ban('ApiController.search', LIFTED_AFTER, '1h');
    await a.ban('ApiController.search', LIFTED_BEFORE, '1h');
    await a.unban('ApiController.search', LIFTED_BEFORE);
    await a.setOverride('exports', 'acme', { count: 20 }, '1h');
    await a.set('search', { count: 4 });
    const expected = { banned: 403, override: '20', limit: '4' };
    for (const app of apps) {
      await until(async () => JSON.stringify(await enforced(app)) === JSON.stringify(expected), {
        timeoutMs: 2_000,
        what: 'the controls in force on every instance',
      });
    }

    // Killed (by PID) and started again on its port, with no persistence: Redis comes back empty.
    const port = server.port;
    await server.kill();
    await server.stop();
    server = await startRedisServer(deaf, port);
    const redis = server.client();

    // A lift made once Redis is back, before or after the instances write back what they hold: the
    // second instance hears nothing of it, and holds the ban until it reads the set again.
    await until(
      async () =>
        a.unban('ApiController.search', LIFTED_AFTER).then(
          () => true,
          () => false,
        ),
      {
        timeoutMs: 10_000,
        what: 'the unban on the restarted Redis',
      },
    );
    await until(async () => (await inRedis(redis, keyPrefix)).bans.includes(BANNED), {
      timeoutMs: 10_000,
      what: 'the ban written back to Redis',
    });
    // Two full reads more on every instance (each 300 ms): what they hold is what Redis holds now.
    const reloads = apps.map(reloadsOf);
    await until(() => apps.every((app, i) => reloadsOf(app) >= reloads[i] + 2), {
      timeoutMs: 10_000,
      what: 'two more reads on every instance',
    });

    expect(await inRedis(redis, keyPrefix)).toEqual({
      bans: [BANNED],
      overrides: ['acme'],
      limit: JSON.stringify({ count: 4 }),
    });
    for (const app of apps) {
      expect(await enforced(app)).toEqual(expected);
      const http = () => request(app.getHttpServer());
      expect((await http().get('/search').set(from(LIFTED_AFTER))).status).toBe(200);
      expect((await http().get('/search').set(from(LIFTED_BEFORE))).status).toBe(200);
    }
    expect((await a.bans()).map((ban) => ban.identity)).toEqual([BANNED]);

    // Said in the logs (a line per kind, not one per read) and in health.
    const lines = logs.flatMap((log) => log.at('warn', /Redis had lost/));
    expect(lines.length).toBeGreaterThanOrEqual(1);
    expect(lines.filter((line) => / ban/.test(line)).length).toBeLessThanOrEqual(apps.length);
    const healths = await Promise.all(
      apps.map(async (app) => (await app.get(RateLimitHealthIndicator).isHealthy()).rate_limit),
    );
    expect(healths.some((health) => (health.liveControlsLost?.times ?? 0) >= 1)).toBe(true);
  });

  it('an evicting full Redis (allkeys-lru): the control keys it evicted are written back, and the loss is named', async () => {
    server = await startRedisServer(['--maxmemory', '2mb', '--maxmemory-policy', 'allkeys-lru']);
    const keyPrefix = uniquePrefix();
    // Read every 2 s: the fill, in a few hundred ms, touches no control key and evicts them all.
    const [a] = await instances([server.url], keyPrefix, 2_000);
    const [app] = apps;
    await a.ban('*', BANNED, '1h');
    await a.setOverride('exports', 'acme', { count: 20 }, '1h');
    await a.set('search', { count: 4 });
    const redis = server.client();
    const health = app.get(RateLimitHealthIndicator);
    await health.isHealthy(); // notes evicted_keys before the fill

    expect(await fill(server)).toBe('taken');
    // Evicted (the fill wrote 8 MB into 2 MB, the oldest keys first).
    expect(await inRedis(redis, keyPrefix)).toEqual({ bans: [], overrides: [], limit: null });

    await until(
      async () =>
        JSON.stringify(await inRedis(redis, keyPrefix)) ===
        JSON.stringify({
          bans: [BANNED],
          overrides: ['acme'],
          limit: JSON.stringify({ count: 4 }),
        }),
      { timeoutMs: 10_000, what: 'the evicted controls written back' },
    );
    expect(await enforced(app)).toEqual({ banned: 403, override: '20', limit: '4' });
    const { rate_limit } = await health.isHealthy();
    expect(rate_limit.status).toBe('degraded');
    expect(rate_limit.liveControlsLost?.times).toBeGreaterThanOrEqual(1);
    expect(logs[0].at('warn', /Redis had lost/).length).toBeGreaterThanOrEqual(1);
  });
});

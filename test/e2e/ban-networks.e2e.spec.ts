import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { RateLimit } from 'nest-rate-limit';
import {
  MemoryConfigCentre,
  RateLimitConfigCentre,
  RateLimitManagementService,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { STORES, describeStoresAndPlatforms, type Platform, type StoreCase } from '../support/matrix.js';
import { until as eventually } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/*
 * Bans as an operator gives them: a network holds for every address in it; what would match no
 * request (an address written with leading zeros, in hex, as one number) is refused, naming the
 * forms taken; a '*' ban's refusal names no rule; a change reaches the other instances in its news,
 * without their reading every ban again.
 */

const tenantOf = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'];

@Controller()
class ApiController {
  /** 100 a minute per client address. */
  @Get('search')
  @RateLimit({ count: 100, window: '1m' })
  search() {
    return 'found';
  }

  /** Per tenant; live values under 'exports'. */
  @Get('exports')
  @RateLimit({ count: 100, window: '1m', configKey: 'exports', by: tenantOf })
  exports() {
    return 'exported';
  }

  /** Per client address; live values under 'downloads'. */
  @Get('downloads')
  @RateLimit({ count: 100, window: '1m', configKey: 'downloads' })
  downloads() {
    return 'downloaded';
  }
}

async function startApp(
  store: StoreCase,
  platform: Platform,
  keyPrefix = uniquePrefix(),
  extra: object = {},
): Promise<INestApplication> {
  const redis = await store.redis();
  return createTestApp({
    platform,
    trustProxy: true,
    controllers: [ApiController],
    rateLimit: {
      redis,
      keyPrefix,
      configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
      extensions: [rateLimitManagement()],
      ...extra,
    },
  });
}

const from = (address: string) => ({ 'X-Forwarded-For': address });

describeStoresAndPlatforms('bans of networks', (store, platform) => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it('a network banned holds for every address in it, under its rule or every rule; unban lifts it', async () => {
    const app = await startApp(store, platform);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const http = () => request(app.getHttpServer());

    expect((await management.ban('ApiController.search', '198.51.100.0/24', '10m')).identity).toBe('198.51.100.0/24');
    await http().get('/search').set(from('198.51.100.77')).expect(403);
    await http().get('/search').set(from('198.51.100.200')).expect(403);
    await http().get('/search').set(from('198.51.101.1')).expect(200);
    await http().get('/downloads').set(from('198.51.100.77')).expect(200);

    // Under every rule, the rule counted by tenant too; written with host bits, kept as its network.
    expect((await management.ban('*', '203.0.113.99/24', '10m')).identity).toBe('203.0.113.0/24');
    await http().get('/exports').set(from('203.0.113.5')).set('x-tenant', 'acme').expect(403);
    // IPv6: a /48 holds each client's /64 in it; IPv4-mapped as IPv4.
    expect((await management.ban('*', '2001:DB8:77::/48', '10m')).identity).toBe('2001:db8:77::/48');
    await http().get('/search').set(from('2001:db8:77:5::9')).expect(403);
    await http().get('/search').set(from('2001:db8:78::9')).expect(200);
    await http().get('/search').set(from('::ffff:203.0.113.6')).expect(403);

    expect(await management.unban('ApiController.search', '198.51.100.0/24')).toBe(true);
    await http().get('/search').set(from('198.51.100.77')).expect(200);
    expect((await management.bans()).map(({ identity }) => identity).sort()).toEqual([
      '2001:db8:77::/48',
      '203.0.113.0/24',
    ]);
  });

  it('refuses what would match no request, naming the forms it takes', async () => {
    const app = await startApp(store, platform);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const forms =
      /give an IPv4 address in four decimal parts without leading zeros \(203\.0\.113\.7\), an IPv6 address \(2001:db8::7\), or a network of either \(203\.0\.113\.0\/24, 2001:db8::\/48\)/;
    for (const written of ['010.0.0.1', '0x0a000001', '10.1', '167772161', '010.0.0.0/8']) {
      await expect(management.ban('ApiController.search', written, '1h')).rejects.toThrow(forms);
    }
    await expect(management.ban('ApiController.search', 'mallory', '1h')).rejects.toThrow(
      /'identity' "mallory" is no address, and rule "ApiController.search" counts by client address/,
    );
    await expect(management.ban('*', '10.0.0.0/33', '1h')).rejects.toThrow(/a prefix length is \/0 to \/32 for IPv4/);
    // Under every rule, where one counts by tenant: a name, or a number, may be a tenant's.
    await expect(management.ban('*', '0x0a000001', '1h')).rejects.toThrow(forms);
    expect((await management.ban('*', '167772161', '1h')).identity).toBe('167772161');
    // An override is for one client: no network.
    await expect(management.setOverride('downloads', '198.51.100.0/24', { count: 5 }, '1h')).rejects.toThrow(
      /is a network, and an override is for one client/,
    );
    expect((await management.bans()).map(({ identity }) => identity)).toEqual(['167772161']);
  });

  it("a '*' ban's refusal says the identity is banned, naming no rule", async () => {
    const app = await startApp(store, platform);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    await management.ban('*', '192.0.2.60', '1h');
    const refused = await request(app.getHttpServer()).get('/search').set(from('192.0.2.60')).expect(403);
    expect(refused.body.message).toBe('Refused: banned; retry in 3600 s');
    await management.ban('ApiController.search', '192.0.2.61', '1h');
    const byRule = await request(app.getHttpServer()).get('/search').set(from('192.0.2.61')).expect(403);
    expect(byRule.body.message).toBe("Refused: banned (rate limit 'ApiController.search'); retry in 3600 s");
  });
});

/** Calls of a command Redis has answered (`INFO commandstats`). */
async function commandCalls(redis: Redis, command: string): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
}

describe('a ban change on instances sharing Redis', () => {
  const store = STORES.find(({ name }) => name === 'Redis')!;
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it('reaches the other instance in its news: no instance reads the bans again', async () => {
    const keyPrefix = uniquePrefix();
    // No periodic read during the test: what the other instance holds comes from the news.
    const extra = { liveConfig: { refreshMs: 600_000 } };
    const first = await startApp(store, 'express', keyPrefix, extra);
    apps.push(first);
    const other = await startApp(store, 'express', keyPrefix, extra);
    apps.push(other);
    const inSync = (app: INestApplication) => (app.get(RateLimitConfigCentre) as RedisConfigCentre).state.inSync;
    await eventually(() => inSync(first) && inSync(other), { timeoutMs: 5_000, what: 'both instances subscribed' });
    await first.get(RateLimitManagementService).ban('*', '198.51.100.0/28', '1h');
    await eventually(
      async () => (await request(other.getHttpServer()).get('/search').set(from('198.51.100.9'))).status === 403,
      {
        timeoutMs: 5_000,
        what: 'the first ban on the other instance',
      },
    );

    const redis = new Redis((await store.redis())!);
    try {
      const reads = await commandCalls(redis, 'zrangebyscore');
      await first.get(RateLimitManagementService).ban('ApiController.search', '192.0.2.44', '1h');
      await eventually(
        async () => (await request(other.getHttpServer()).get('/search').set(from('192.0.2.44'))).status === 403,
        { timeoutMs: 1_000, what: 'the ban on the other instance' },
      );
      expect(await first.get(RateLimitManagementService).unban('ApiController.search', '192.0.2.44')).toBe(true);
      await eventually(
        async () => (await request(other.getHttpServer()).get('/search').set(from('192.0.2.44'))).status === 200,
        { timeoutMs: 1_000, what: 'the ban lifted on the other instance' },
      );
      expect(await commandCalls(redis, 'zrangebyscore')).toBe(reads);
    } finally {
      redis.disconnect();
    }
  });
});

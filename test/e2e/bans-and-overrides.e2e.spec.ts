import { Controller, type ExecutionContext, Get, type INestApplication, Post } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitConfigurationError, RateLimitModule } from 'nest-rate-limit';
import {
  MemoryConfigCentre,
  RateLimitManagementService,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import {
  STORES,
  describeStores,
  describeStoresAndPlatforms,
  type Platform,
  type StoreCase,
} from '../support/matrix.js';
import { until as eventually } from '../support/poll.js';
import { scriptCalls } from '../support/shared-redis.js';
import { connectSocket, disconnectSockets, sendMessage } from '../support/socket.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

const headerOf = (name: string) => (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers[name];
const tenantOf = headerOf('x-tenant');

@Controller()
class ApiController {
  /** 2 a minute per client address. */
  @Get('search')
  @RateLimit({ count: 2, window: '1m' })
  search() {
    return 'found';
  }

  /** 3 a minute per tenant; live values under 'exports'. */
  @Get('exports')
  @RateLimit({ count: 3, window: '1m', configKey: 'exports', by: tenantOf })
  exports() {
    return 'exported';
  }

  /** 2 a minute per client address; live values under 'downloads'. */
  @Get('downloads')
  @RateLimit({ count: 2, window: '1m', configKey: 'downloads' })
  downloads() {
    return 'downloaded';
  }

  /** Per tenant, by plan: 2 a minute, 5 on 'pro' (live values under 'plans' and 'plans.pro'). */
  @Get('plans')
  @RateLimit({
    count: 2,
    window: '1m',
    configKey: 'plans',
    by: tenantOf,
    tiers: { of: headerOf('x-plan'), limits: { pro: 5 } },
  })
  plans() {
    return 'planned';
  }

  @Get('open')
  open() {
    return 'open';
  }
}

/** A clock the test moves: bans and overrides end on it, and the store counts on it. */
class TestClock {
  now = Date.now();
  readonly read = () => this.now;
}

async function startApp(
  store: StoreCase,
  platform: Platform,
  clock: TestClock,
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
      clock: clock.read,
      configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
      extensions: [rateLimitManagement()],
      ...extra,
    },
  });
}

const from = (address: string) => ({ 'X-Forwarded-For': address });

describeStoresAndPlatforms('bans', (store, platform) => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it('refuses a banned identity with 403 and Retry-After until the ban ends, asking the store nothing', async () => {
    const clock = new TestClock();
    const app = await startApp(store, platform, clock);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const http = () => request(app.getHttpServer());

    await management.ban('ApiController.search', '198.51.100.7', '10m', { by: 'oncall' });
    const refused = await http().get('/search').set(from('198.51.100.7'));
    expect(refused.status).toBe(403);
    expect(refused.headers['retry-after']).toBe('600');
    expect(refused.body).toMatchObject({ statusCode: 403, error: 'Forbidden', retryAfter: 600 });
    // Another client, another route: not banned.
    await http().get('/search').set(from('198.51.100.8')).expect(200);
    await http().get('/exports').set(from('198.51.100.7')).set('x-tenant', 'acme').expect(200);

    // Known to this instance: no store call per banned request.
    const redisUrl = await store.redis();
    const redis = redisUrl ? new Redis(redisUrl) : undefined;
    try {
      const before = redis ? await scriptCalls(redis) : 0;
      for (let i = 0; i < 20; i += 1) await http().get('/search').set(from('198.51.100.7')).expect(403);
      if (redis) expect(await scriptCalls(redis)).toBe(before);
    } finally {
      redis?.disconnect();
    }

    // It ends by itself.
    clock.now += 600_000;
    await http().get('/search').set(from('198.51.100.7')).expect(200);
    expect((await management.changeLog(1))[0]).toMatchObject({
      change: 'ban',
      by: 'oncall',
      rules: ['ApiController.search'],
      identity: '198.51.100.7',
    });
  });

  it("'*' bans an address on every limited route; unban lifts it at once", async () => {
    const clock = new TestClock();
    const app = await startApp(store, platform, clock);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const http = () => request(app.getHttpServer());
    await management.ban('*', '203.0.113.9', new Date(clock.now + 3_600_000));
    await http().get('/search').set(from('203.0.113.9')).expect(403);
    // Counted by tenant, but the address is banned on every rule.
    await http().get('/exports').set(from('203.0.113.9')).set('x-tenant', 'acme').expect(403);
    // A route no rule limits is not the limiter's.
    await http().get('/open').set(from('203.0.113.9')).expect(200);
    expect(await management.bans()).toEqual([
      { rule: '*', identity: '203.0.113.9', until: new Date(clock.now + 3_600_000).toISOString() },
    ]);
    expect(await management.unban('*', '203.0.113.9')).toBe(true);
    await http().get('/search').set(from('203.0.113.9')).expect(200);
    expect(await management.unban('*', '203.0.113.9')).toBe(false);
  });

  it('answers 429 instead with bans: { status: 429 }, and refuses what cannot be a ban', async () => {
    const clock = new TestClock();
    const app = await startApp(store, platform, clock, uniquePrefix(), { bans: { status: 429 } });
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    await management.ban('ApiController.exports', 'mallory', '90s');
    const refused = await request(app.getHttpServer()).get('/exports').set('x-tenant', 'mallory');
    expect([refused.status, refused.headers['retry-after']]).toEqual([429, '90']);

    await expect(management.ban('NoSuch.rule', 'x', '1h')).rejects.toThrow(/no rule is named "NoSuch.rule"/);
    await expect(management.ban('*', 'x', '400d')).rejects.toThrow("'until' must be a time in the next 365 days");
    await expect(management.ban('*', 'x', new Date(clock.now - 1))).rejects.toThrow(RateLimitConfigurationError);
  });

  it('bans an address in any spelling as the rule counts it (IPv4-mapped as IPv4, IPv6 per /64)', async () => {
    const app = await startApp(store, platform, new TestClock());
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const http = () => request(app.getHttpServer());
    expect((await management.ban('ApiController.search', '::ffff:198.51.100.20', '10m')).identity).toBe(
      '198.51.100.20',
    );
    await http().get('/search').set(from('198.51.100.20')).expect(403);
    expect((await management.ban('ApiController.downloads', '2001:db8:5:6::1', '10m')).identity).toBe(
      '2001:db8:5:6::/64',
    );
    await http().get('/downloads').set(from('2001:db8:5:6:ffff::9')).expect(403);
    expect((await management.ban('*', '::FFFF:203.0.113.50', '10m')).identity).toBe('203.0.113.50');
    await http().get('/exports').set(from('203.0.113.50')).set('x-tenant', 'acme').expect(403);
    expect(await management.unban('ApiController.search', '::ffff:198.51.100.20')).toBe(true);
    await http().get('/search').set(from('198.51.100.20')).expect(200);
  });
});

describeStoresAndPlatforms('per-identity overrides', (store, platform) => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it("gives one tenant its own count until it ends, while traffic runs; the others keep the rule's", async () => {
    const clock = new TestClock();
    const app = await startApp(store, platform, clock);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const get = (tenant: string) => request(app.getHttpServer()).get('/exports').set('x-tenant', tenant);

    const entry = await management.setOverride('exports', 'acme', { count: 5 }, '30s', { by: 'sales' });
    expect(entry).toEqual({
      configKey: 'exports',
      identity: 'acme',
      values: { count: 5 },
      until: new Date(clock.now + 30_000).toISOString(),
    });
    const seen: number[] = [];
    for (let i = 0; i < 6; i += 1) seen.push((await get('acme')).status);
    expect(seen).toEqual([200, 200, 200, 200, 200, 429]);
    expect((await get('acme')).headers['ratelimit-limit']).toBe('5');
    const others: number[] = [];
    for (let i = 0; i < 4; i += 1) others.push((await get('globex')).status);
    expect(others).toEqual([200, 200, 200, 429]);

    // It ends at its time, mid-window: acme is at 5 of the rule's 3 now.
    clock.now += 30_000;
    const ended = await get('acme');
    expect([ended.status, ended.headers['ratelimit-limit']]).toEqual([429, '3']);
    // And the next window counts it under the rule's 3.
    clock.now += 30_000;
    const after: number[] = [];
    for (let i = 0; i < 4; i += 1) after.push((await get('acme')).status);
    expect(after).toEqual([200, 200, 200, 429]);
    expect(await management.overrides()).toEqual([]);
    expect((await management.changeLog(1))[0]).toMatchObject({ change: 'set-override', by: 'sales', identity: 'acme' });
  });

  it('is checked as any limit is, naming the field', async () => {
    const app = await startApp(store, platform, new TestClock());
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    await expect(management.setOverride('exports', 'acme', { count: 0 }, '1h')).rejects.toThrow(
      "'count' must be a positive whole number, got 0",
    );
    await expect(management.setOverride('exports', 'acme', { mode: 'off' }, '1h')).rejects.toThrow(
      "'mode' cannot be set per identity (only count and window)",
    );
    await expect(management.setOverride('nope', 'acme', { count: 5 }, '1h')).rejects.toThrow(
      'no rule reads config key "nope"',
    );
    expect(await management.deleteOverride('exports', 'acme')).toBe(false);
  });

  it('takes an address given for a rule counted by address as the rule counts it: IPv6 per /64, IPv4-mapped as IPv4', async () => {
    const app = await startApp(store, platform, new TestClock());
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const limitFor = async (address: string) =>
      (await request(app.getHttpServer()).get('/downloads').set(from(address))).headers['ratelimit-limit'];

    const v6 = await management.setOverride('downloads', '2001:db8:1:2:3:4:5:6', { count: 4 }, '10m');
    expect(v6.identity).toBe('2001:db8:1:2::/64');
    expect(await limitFor('2001:db8:1:2:aaaa::1')).toBe('4');
    const mapped = await management.setOverride('downloads', '::ffff:10.0.0.1', { count: 5 }, '10m');
    expect(mapped.identity).toBe('10.0.0.1');
    expect(await limitFor('10.0.0.1')).toBe('5');
    expect(await limitFor('10.0.0.2')).toBe('2');
    expect((await management.overrides()).map(({ identity }) => identity).sort()).toEqual([
      '10.0.0.1',
      '2001:db8:1:2::/64',
    ]);
    // Ended by the address as given, too.
    expect(await management.deleteOverride('downloads', '2001:db8:1:2:3:4:5:6')).toBe(true);
    expect(await limitFor('2001:db8:1:2:aaaa::1')).toBe('2');
    // A rule counted by something else keeps the identity as given.
    expect((await management.setOverride('exports', '::ffff:10.0.0.1', { count: 5 }, '10m')).identity).toBe(
      '::ffff:10.0.0.1',
    );
  });

  it("refuses an override on the allow list's key, or on a tiered rule's own key, naming the key", async () => {
    const app = await startApp(store, platform, new TestClock(), uniquePrefix(), { allow: { configKey: 'allowed' } });
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    await expect(management.setOverride('allowed', 'acme', { count: 5 }, '1h')).rejects.toThrow(
      /config key 'allowed' holds the module's allow list/,
    );
    await expect(management.setOverride('plans', 'acme', { count: 9 }, '1h')).rejects.toThrow(
      /config key 'plans': rule "ApiController.plans" counts by tier.*'plans.pro'/,
    );
    expect(await management.overrides()).toEqual([]);
    // On the tier's own key it applies to the tier's requests.
    await management.setOverride('plans.pro', 'acme', { count: 9 }, '1h');
    const pro = await request(app.getHttpServer()).get('/plans').set('x-tenant', 'acme').set('x-plan', 'pro');
    expect(pro.headers['ratelimit-limit']).toBe('9');
  });

  it("reads 'until' as a Date, an ISO time, ms since the epoch or a duration with its unit, and refuses a bare string of digits", async () => {
    const clock = new TestClock();
    const app = await startApp(store, platform, clock);
    apps.push(app);
    const management = app.get(RateLimitManagementService);
    const at = (ms: number) => new Date(ms).toISOString();
    const untilOf = async (until: Date | string | number) =>
      (await management.setOverride('exports', 'acme', { count: 5 }, until)).until;

    expect(await untilOf(clock.now + 60_000)).toBe(at(clock.now + 60_000));
    expect(await untilOf(new Date(clock.now + 120_000))).toBe(at(clock.now + 120_000));
    expect(await untilOf(at(clock.now + 180_000))).toBe(at(clock.now + 180_000));
    expect(await untilOf('10m')).toBe(at(clock.now + 600_000));
    for (const bare of ['60', ' 60 ', '1.5']) {
      await expect(management.setOverride('exports', 'acme', { count: 5 }, bare)).rejects.toThrow(
        /RateLimitManagementService.setOverride: 'until' .*has no unit/,
      );
      await expect(management.ban('*', 'acme', bare)).rejects.toThrow(/RateLimitManagementService.ban: 'until'/);
    }
    await expect(management.ban('*', 'acme', 'next tuesday')).rejects.toThrow(/'until' must be/);
    // A number is a time, not a duration: 60 ms after 1970 has long passed.
    await expect(management.ban('*', 'acme', 60)).rejects.toThrow(/'until' must be a time in the next 365 days/);
  });
});

@WebSocketGateway()
class ChatGateway {
  @SubscribeMessage('ping')
  @RateLimit({ count: 100, window: '1m' })
  ping() {
    return 'pong';
  }
}

describeStores('a ban on a WebSocket client', (store) => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    disconnectSockets();
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it("refuses a banned address's messages", async () => {
    const redis = await store.redis();
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        RateLimitModule.forRoot({
          redis,
          keyPrefix: uniquePrefix(),
          configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
          extensions: [rateLimitManagement()],
        }),
      ],
      providers: [ChatGateway],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    await app.get(RateLimitManagementService).ban('*', '127.0.0.1', '1h');
    const answer = await sendMessage(await connectSocket(await app.getUrl()), 'ping');
    expect(answer).toMatchObject({ exception: { status: 'error', rule: 'ChatGateway.ping' } });
  });
});

describe('bans and overrides on instances sharing Redis', () => {
  const store = STORES.find(({ name }) => name === 'Redis')!;
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  /** Two instances of the app on one Redis, under one key prefix. */
  async function twoInstances(keyPrefix: string): Promise<[INestApplication, INestApplication]> {
    const first = await startApp(store, 'express', new TestClock(), keyPrefix);
    apps.push(first);
    const second = await startApp(store, 'express', new TestClock(), keyPrefix);
    apps.push(second);
    return [first, second];
  }

  it('written at once for one identity, leave one entry: the last written', async () => {
    const keyPrefix = uniquePrefix();
    const [first, second] = await twoInstances(keyPrefix);
    const redis = new Redis((await store.redis())!);
    try {
      for (let round = 0; round < 10; round += 1) {
        await Promise.all([
          first.get(RateLimitManagementService).setOverride('exports', 'acme', { count: 10 + round }, '1h'),
          second.get(RateLimitManagementService).setOverride('exports', 'acme', { count: 100 + round }, '1h'),
          first.get(RateLimitManagementService).ban('ApiController.search', '192.0.2.1', `${round + 1}h`),
          second.get(RateLimitManagementService).ban('ApiController.search', '192.0.2.1', `${round + 2}h`),
        ]);
        expect(await redis.zcard(`${keyPrefix}:config:overrides`)).toBe(1);
        expect(await redis.zcard(`${keyPrefix}:config:bans`)).toBe(1);
      }
      const [entry] = await second.get(RateLimitManagementService).overrides();
      expect([19, 109]).toContain(entry.values.count);
    } finally {
      redis.disconnect();
    }
  });

  it('a ban and an override reach another instance within a second', async () => {
    const [first, second] = await twoInstances(uniquePrefix());
    await first.get(RateLimitManagementService).ban('ApiController.search', '192.0.2.44', '1h');
    const startedAt = performance.now();
    await eventually(
      async () => (await request(second.getHttpServer()).get('/search').set(from('192.0.2.44'))).status === 403,
      { timeoutMs: 1_000, what: 'the ban reaching the second instance' },
    );
    expect(performance.now() - startedAt).toBeLessThan(1_000);

    // An override the same way: tenant acme's own 1 on the second instance (the rule's is 3).
    await first.get(RateLimitManagementService).setOverride('exports', 'acme', { count: 1 }, '1h');
    const overriddenAt = performance.now();
    await eventually(
      async () =>
        (await request(second.getHttpServer()).get('/exports').set('x-tenant', 'acme')).headers['ratelimit-limit'] ===
        '1',
      { timeoutMs: 1_000, what: 'the override reaching the second instance' },
    );
    expect(performance.now() - overriddenAt).toBeLessThan(1_000);
  });
});

describe('a process without the rules (as the CLI is), on the Redis of an app', () => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it("takes an address as the app's rule counts it, with the app's ipv6PrefixBits", async () => {
    const store = STORES.find(({ name }) => name === 'Redis')!;
    const keyPrefix = uniquePrefix();
    const app = await startApp(store, 'express', new TestClock(), keyPrefix, { ipv6PrefixBits: 56 });
    apps.push(app);
    const operator = await createTestApp({
      controllers: [],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix,
        configCentre: RedisConfigCentre,
        extensions: [rateLimitManagement()],
        globalGuard: false,
      },
    });
    apps.push(operator);
    const management = operator.get(RateLimitManagementService);
    const http = () => request(app.getHttpServer());

    const override = await management.setOverride('downloads', '2001:db8:1:2ff::9', { count: 4 }, '1h');
    expect(override.identity).toBe('2001:db8:1:200::/56');
    const banned = await management.ban('ApiController.search', '::ffff:198.51.100.30', '1h');
    expect(banned.identity).toBe('198.51.100.30');
    const everywhere = await management.ban('*', '2001:db8:9:9ff::1', '1h');
    expect(everywhere.identity).toBe('2001:db8:9:900::/56');
    await eventually(
      async () =>
        (await http().get('/downloads').set(from('2001:db8:1:2aa::1'))).headers['ratelimit-limit'] === '4' &&
        (await http().get('/search').set(from('198.51.100.30'))).status === 403 &&
        (await http().get('/exports').set(from('2001:db8:9:9aa::1')).set('x-tenant', 'acme')).status === 403,
      { timeoutMs: 1_000, what: "the entries applying on the app's instance" },
    );
  });
});

@Controller()
class TokensController {
  @Post('tokens')
  @RateLimit({ count: 1_000, window: '1m', configKey: 'tokens', cost: 10, settleCost: { actual: () => 5, max: 100 } })
  spend() {
    return 'spent';
  }
}

describe('a process without the rules, on the Redis of an app with a settleCost rule', () => {
  it('knows the rule by its catalogue, and checks values against it', async () => {
    const store = STORES.find(({ name }) => name === 'Redis')!;
    const keyPrefix = uniquePrefix();
    // The app catalogues its rules in Redis (rateLimitManagement()) for the process that has none.
    const rateLimit = {
      redis: await store.redis(),
      keyPrefix,
      configCentre: RedisConfigCentre,
      extensions: [rateLimitManagement()],
    };
    const app = await createTestApp({ controllers: [TokensController], rateLimit });
    const operator = await createTestApp({ controllers: [], rateLimit: { ...rateLimit, globalGuard: false } });
    try {
      const management = operator.get(RateLimitManagementService);
      await management.set('tokens', { count: 5_000 });
      await expect(management.set('tokens', { count: 0 })).rejects.toThrow("'count' must be a positive whole number");
      await eventually(
        async () => (await request(app.getHttpServer()).post('/tokens')).headers['ratelimit-limit'] === '5000',
        { timeoutMs: 1_000, what: 'the limit reaching the app' },
      );
    } finally {
      await Promise.all([app.close(), operator.close()]);
    }
  });
});

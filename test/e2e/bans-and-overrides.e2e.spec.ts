import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { Redis } from 'ioredis';
import { RateLimit, RateLimitConfigurationError, RateLimitModule } from 'nest-rate-limit';
import { MemoryConfigCentre, RateLimitManagementService, RedisConfigCentre } from 'nest-rate-limit/live';
import { io, type Socket } from 'socket.io-client';
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
import { createTestApp, uniquePrefix } from '../support/test-app.js';

const tenantOf = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-tenant'];

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
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const socket of sockets.splice(0)) socket.disconnect();
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
        }),
      ],
      providers: [ChatGateway],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    apps.push(app);
    await app.listen(0, '127.0.0.1');
    await app.get(RateLimitManagementService).ban('*', '127.0.0.1', '1h');
    const socket = io((await app.getUrl()).replace('[::1]', '127.0.0.1'), {
      transports: ['websocket'],
      forceNew: true,
    });
    sockets.push(socket);
    const answer = await new Promise<unknown>((resolve) => {
      socket.once('exception', (exception: unknown) => resolve({ exception }));
      socket.emit('ping', {}, (ack: unknown) => resolve({ ack }));
    });
    expect(answer).toMatchObject({ exception: { status: 'error', rule: 'ChatGateway.ping' } });
  });
});

describe('a ban across instances sharing Redis', () => {
  const apps: INestApplication[] = [];
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it('reaches another instance within a second', async () => {
    const store = STORES.find(({ name }) => name === 'Redis')!;
    const keyPrefix = uniquePrefix();
    const [first, second] = [
      await startApp(store, 'express', new TestClock(), keyPrefix),
      await startApp(store, 'express', new TestClock(), keyPrefix),
    ];
    apps.push(first, second);
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

import { Controller, Get, Module, UseGuards } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Cluster, Redis } from 'ioredis';
import { RateLimit, RateLimitConfigurationError, RateLimitGuard, RateLimitModule } from 'nest-rate-limit';
import { RedisService, rateLimitKeys } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { LogCapture } from '../support/log-capture.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

@Controller('opt-in')
@UseGuards(RateLimitGuard)
class OptInController {
  @Get()
  @RateLimit(2, '1m')
  get() {
    return {};
  }
}

@Controller('not-guarded')
class NotGuardedController {
  @Get()
  @RateLimit(1, '1m')
  get() {
    return {};
  }
}

/** A rule decided after the app's guards, by the interceptor `@RateLimit` adds, on a route the guard does not cover. */
@Controller('not-guarded-per-client')
class NotGuardedPerClientController {
  @Get()
  @RateLimit({ count: 1, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<{ ip: string }>().ip })
  get() {
    return {};
  }
}

/** The same rule where `@UseGuards` applies the guard. */
@Controller('opt-in-per-client')
@UseGuards(RateLimitGuard)
class OptInPerClientController {
  @Get()
  @RateLimit({ count: 1, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<{ ip: string }>().ip })
  get() {
    return {};
  }
}

@Controller('plain')
class PlainController {
  @Get()
  get() {
    return {};
  }
}

@Controller('plain-guarded')
@UseGuards(RateLimitGuard)
class PlainGuardedController {
  @Get()
  get() {
    return {};
  }
}

/** A feature module that does not import RateLimitModule: it relies on `isGlobal`. */
@Module({
  controllers: [OptInController, NotGuardedController, NotGuardedPerClientController, OptInPerClientController],
})
class FeatureModule {}

describe('module options', () => {
  let server: RedisServer;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterAll(() => server?.stop());

  it('forRootAsync with isGlobal and globalGuard: false limits only where @UseGuards applies the guard', async () => {
    const prefix = uniquePrefix();
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true, load: [() => ({ redisUrl: server.url, prefix })] }),
        RateLimitModule.forRootAsync({
          isGlobal: true,
          globalGuard: false,
          inject: [ConfigService],
          useFactory: (config: ConfigService) => ({
            redis: config.get<string>('redisUrl'),
            keyPrefix: config.get<string>('prefix'),
          }),
        }),
        FeatureModule,
      ],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    try {
      const http = request(app.getHttpServer());
      const first = await http.get('/opt-in').expect(200);
      expect(first.headers['ratelimit-remaining']).toBe('1');
      await http.get('/opt-in').expect(200);
      await http.get('/opt-in').expect(429);
      expect((await sequential(3, () => http.get('/not-guarded'))).statuses).toEqual([200, 200, 200]);
      // A rule the interceptor decides is no exception: limited only where the guard applies.
      expect((await sequential(3, () => http.get('/not-guarded-per-client'))).statuses).toEqual([200, 200, 200]);
      expect((await sequential(2, () => http.get('/opt-in-per-client'))).statuses).toEqual([200, 429]);
      const redis = server.client();
      const keys = await redis.keys(`${prefix}:*`);
      // The counters alone (no marker: failover.marker is off by default), for supertest's address.
      const optIn = rateLimitKeys(prefix, 'OptInController.get', '127.0.0.1', 'fixed-window');
      // One per route the guard covers: none for the routes it does not.
      expect(keys).toHaveLength(2);
      expect(keys).toContain(optIn.key);
      expect(await fixedWindowCount(redis, optIn.key)).toBe(2);
    } finally {
      await app.close();
    }
  });

  it('globalGuard: false with a default the interceptor decides limits only where @UseGuards applies the guard', async () => {
    const app = await createTestApp({
      controllers: [PlainController, PlainGuardedController],
      rateLimit: {
        redis: server.url,
        keyPrefix: uniquePrefix(),
        globalGuard: false,
        defaults: [{ count: 1, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<{ ip: string }>().ip }],
      },
    });
    try {
      const http = request(app.getHttpServer());
      expect((await sequential(3, () => http.get('/plain'))).statuses).toEqual([200, 200, 200]);
      expect((await sequential(2, () => http.get('/plain-guarded'))).statuses).toEqual([200, 429]);
    } finally {
      await app.close();
    }
  });

  it('uses a client the application supplies and leaves it open on shutdown', async () => {
    const client = server.client();
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: { client }, keyPrefix: uniquePrefix() })],
      controllers: [NotGuardedController],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    expect(app.get(RedisService).client).toBe(client);
    await request(app.getHttpServer()).get('/not-guarded').expect(200);
    await request(app.getHttpServer()).get('/not-guarded').expect(429);
    await app.close();
    expect(client.status).toBe('ready');
    expect(await client.ping()).toBe('PONG');
  });

  it('closes the connection it created on shutdown', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        RateLimitModule.forRoot({ redis: { url: server.url, connectTimeout: 1_000 }, keyPrefix: uniquePrefix() }),
      ],
      controllers: [NotGuardedController],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    const { client } = app.get(RedisService);
    expect(client.status).toBe('ready');
    await app.close();
    expect(client.status).toBe('end');
  });

  it('reads thresholds from process.env when ConfigModule is not imported', async () => {
    process.env.RATE_LIMIT_NO_CONFIG_MODULE_COUNT = '1';
    @Controller('env-only')
    class EnvOnlyController {
      @Get()
      @RateLimit(5, '1m', 'no-config-module')
      get() {
        return {};
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot()],
      controllers: [EnvOnlyController],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    try {
      await request(app.getHttpServer()).get('/env-only').expect(200).expect('ratelimit-limit', '1');
      await request(app.getHttpServer()).get('/env-only').expect(429);
    } finally {
      delete process.env.RATE_LIMIT_NO_CONFIG_MODULE_COUNT;
      await app.close();
    }
  });
});

describe('the redis option, checked before the app serves', () => {
  const refused = (redis: unknown) => () => RateLimitModule.forRoot({ redis: redis as never });

  it.each([
    [
      '',
      "'redis' must be a redis:// or rediss:// URL, a Unix socket's path, ioredis options, { cluster: [...] } or { client }, not empty",
    ],
    ['   ', 'not empty'],
    [
      6379,
      "'redis' must be a redis:// or rediss:// URL, a Unix socket's path, ioredis options, { cluster: [...] } or { client }, got 6379",
    ],
    [null, "'redis' must be a redis:// or rediss:// URL"],
    [['redis://a:6379'], "'redis' must be a redis:// or rediss:// URL"],
    [
      'http://cache:6379',
      "'redis' must be a redis:// or rediss:// URL (or a Unix socket's path), not http://, got \"http://cache:6379\"",
    ],
    [
      'localhost:6379',
      "'redis' must be a redis:// or rediss:// URL (or a Unix socket's path): write redis:// before the host",
    ],
    ['//cache:6379', ': write redis:// before the host'],
    ['redis://cache:99999', "'redis' must be a valid URL (redis://[[user]:password@]host[:port][/db])"],
    [
      { url: 'https://cache' },
      "'redis' url must be a redis:// or rediss:// URL (or a Unix socket's path), not https://",
    ],
    [{ url: 6379 }, '\'redis\' url must be a string, got "number"'],
    [{ host: '' }, "'redis' host must be a host name"],
    [{ host: 'cache', port: 0 }, "'redis' port must be a whole number from 1 to 65535, got 0"],
    [{ host: 'cache', port: 'six' }, '\'redis\' port must be a whole number from 1 to 65535, got "six"'],
    [
      { sentinels: [{ host: 'a', port: 26379 }] },
      "'redis' has sentinels but no 'name': the master's name the sentinels know (e.g. 'mymaster')",
    ],
    [{ sentinels: [], name: 'mymaster' }, "'redis' sentinels must list at least one sentinel"],
    [{ sentinels: ['a:26379'], name: 'mymaster' }, "'redis' sentinels has an entry that is no { host, port }"],
    [
      { cluster: [] },
      '\'redis\' { cluster } must list at least one node ({ host, port }, "host:port" or a port), got "an empty array"',
    ],
    [{ cluster: 'a:7000' }, "'redis' { cluster } must list at least one node"],
    [
      { cluster: [{ host: 'a', port: 7000 }, {}] },
      '\'redis\' { cluster } has a node that is no { host, port }, "host:port" or port, got {}',
    ],
    [{ cluster: [7000], options: 'fast' }, "'redis' { cluster } options must be ioredis ClusterOptions (an object)"],
    [
      { cluster: [7000], redisOptions: {} },
      "'redis' { cluster } takes only 'cluster' and 'options' (ioredis ClusterOptions), got redisOptions",
    ],
    [
      { client: {} },
      '\'redis\' { client } must be an ioredis Redis or Cluster instance (with evalsha() and status), got "an object (Object)"',
    ],
    [{ client: 'redis://cache' }, "'redis' { client } must be an ioredis Redis or Cluster instance"],
    [
      { client: { evalSha: () => undefined, isOpen: true } },
      "'redis' { client } must be an ioredis Redis or Cluster instance",
    ],
  ])('refuses %j', (redis, message) => {
    expect(refused(redis)).toThrow(RateLimitConfigurationError);
    expect(refused(redis)).toThrow("RateLimitModule options: 'redis' ");
    expect(refused(redis)).toThrow(message);
  });

  it('never shows a password in its message', () => {
    expect(refused('http://admin:s3cret@cache:6379')).toThrow('got "http://***@cache:6379"');
    expect(refused({ url: 'redis://:s3cret@cache:notaport' })).toThrow('got "redis://***@cache:notaport"');
    expect(refused('redis://:s3cret@cache:99999')).not.toThrow(/s3cret/);
  });

  it('refuses a client with other fields, which it would ignore', () => {
    const client = new Redis({ lazyConnect: true });
    try {
      expect(refused({ client, keyPrefix: 'x' })).toThrow(
        "'redis' { client } takes no other field: the client is used as it is, got keyPrefix",
      );
    } finally {
      client.disconnect();
    }
  });

  it('takes every form ioredis takes', () => {
    const client = new Redis({ lazyConnect: true });
    const cluster = new Cluster([{ host: '127.0.0.1', port: 7000 }], { lazyConnect: true });
    try {
      for (const redis of [
        'redis://127.0.0.1:6379',
        'REDIS://cache',
        'rediss://user:pw@cache.example.com:6380/2',
        'redis://[::1]:6379/0',
        '/run/redis/redis.sock',
        '/run/redis/redis.sock?db=2',
        { url: 'redis://cache:6379', connectTimeout: 1_000 },
        { host: 'cache', port: 6379, db: 1 },
        { host: 'cache', port: '6379' },
        { path: '/run/redis/redis.sock' },
        { sentinels: [{ host: '10.0.0.1', port: 26379 }], name: 'mymaster' },
        { cluster: [{ host: '10.0.0.1', port: 7000 }, '10.0.0.2:7000', 7001] },
        { cluster: [{ host: '10.0.0.1', port: 7000 }], options: { redisOptions: { password: 'pw' } } },
        { client },
        { client: cluster },
      ]) {
        expect(refused(redis), typeof redis === 'string' ? redis : Object.keys(redis).join()).not.toThrow();
      }
    } finally {
      client.disconnect();
      cluster.disconnect();
    }
  });

  it('is checked when forRootAsync resolves its factory', async () => {
    const moduleRef = Test.createTestingModule({
      imports: [RateLimitModule.forRootAsync({ useFactory: () => ({ redis: 'http://cache:6379' }) })],
    });
    await expect(moduleRef.compile()).rejects.toThrow(
      "RateLimitModule options: 'redis' must be a redis:// or rediss:// URL (or a Unix socket's path), not http://, got \"http://cache:6379\"",
    );
  });
});

describe('the default config centre and ConfigModule (loaded only when the module starts)', () => {
  @Controller('scoped-config')
  class ScopedConfigController {
    @Get()
    @RateLimit(5, '1m', 'scoped')
    get() {
      return {};
    }
  }

  /** The limit in force on a fresh app importing `imports` and the module, from its first response. */
  async function limitWith(imports: Parameters<typeof Test.createTestingModule>[0]['imports']): Promise<string> {
    const moduleRef = await Test.createTestingModule({
      imports: [...(imports ?? []), RateLimitModule.forRoot()],
      controllers: [ScopedConfigController],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    try {
      const response = await request(app.getHttpServer()).get('/scoped-config').expect(200);
      return response.headers['ratelimit-limit'];
    } finally {
      await app.close();
    }
  }

  const load = [() => ({ limits: { scoped: { count: 2 } } })];

  it('reads the ConfigService of a global ConfigModule', async () => {
    expect(await limitWith([ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true, load })])).toBe('2');
  });

  it('as before: not that of a ConfigModule the module cannot see (imported elsewhere, not global)', async () => {
    expect(await limitWith([ConfigModule.forRoot({ ignoreEnvFile: true, load })])).toBe('5');
  });
});

describe('bootstrap failures', () => {
  it('leave no Redis connection open when a rule is invalid', async () => {
    const server = await startRedisServer();
    try {
      @Controller('broken')
      class BrokenController {
        @Get()
        @RateLimit(0, '1s')
        get() {}
      }
      const moduleRef = await Test.createTestingModule({
        imports: [RateLimitModule.forRoot({ redis: server.url })],
        controllers: [BrokenController],
      }).compile();
      const app = moduleRef.createNestApplication({ logger: false });
      await expect(app.init()).rejects.toThrow("@RateLimit on BrokenController.get: 'count'");
      const clients = await server.client().client('LIST');
      expect(String(clients)).not.toContain('name=rate-limit');
    } finally {
      await server.stop();
    }
  });

  it('do not come from a paused Redis: the app starts after a bounded wait and serves by storeErrors.policy', async () => {
    const server = await startRedisServer();
    process.kill(server.pid, 'SIGSTOP');
    try {
      @Controller('paused')
      class PausedController {
        @Get()
        @RateLimit(5, '1m')
        get() {}
      }
      const app = await createTestApp({
        controllers: [PausedController],
        rateLimit: { redis: server.url, keyPrefix: uniquePrefix(), storeErrors: { timeoutMs: 50 } },
      });
      try {
        const response = await request(app.getHttpServer()).get('/paused').expect(200);
        expect(response.headers['ratelimit-limit']).toBeUndefined();
      } finally {
        await app.close();
      }
    } finally {
      process.kill(server.pid, 'SIGCONT');
      await server.stop();
    }
  });

  it('warn when two controllers of one name would share counters', async () => {
    const logs = new LogCapture();
    const make = () => {
      @Controller(`twin-${Math.random().toString(36).slice(2)}`)
      class TwinController {
        @Get()
        @RateLimit(1, '1s')
        get() {}
      }
      return TwinController;
    };
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot()],
      controllers: [make(), make()],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: logs });
    await app.init();
    await app.close();
    expect(logs.at('warn', /2 classes are named TwinController/)).toHaveLength(1);
  });
});

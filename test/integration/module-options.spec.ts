import { Controller, Get, Module, UseGuards } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitGuard, RateLimitModule, RedisService, rateLimitKeys } from 'nest-rate-limit';
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

/** A feature module that does not import RateLimitModule: it relies on `isGlobal`. */
@Module({ controllers: [OptInController, NotGuardedController] })
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
      const redis = server.client();
      const keys = await redis.keys(`${prefix}:*`);
      // The counter alone (no marker: failover.marker is off by default), for supertest's address.
      const optIn = rateLimitKeys(prefix, 'OptInController.get', '127.0.0.1', 'fixed-window');
      expect(keys).toEqual([optIn.key]);
      expect(await fixedWindowCount(redis, optIn.key)).toBe(2);
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

import { Controller, Get, type INestApplication, Injectable } from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitConfigCentre, type RateLimitOverride } from 'nest-rate-limit';
import { LogCapture } from '../support/log-capture.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

@Controller('tuned')
class TunedController {
  @Get('a')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.a', by: 'global' })
  a() {
    return {};
  }

  @Get('b')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.b', by: 'global' })
  b() {
    return {};
  }

  @Get('c')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.c', by: 'global' })
  c() {
    return {};
  }
}

describe('thresholds from the config centre', () => {
  let server: RedisServer;
  let app: INestApplication;
  let config: ConfigService;
  const logs = new LogCapture();

  beforeAll(async () => {
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [TunedController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix() },
      logger: logs,
    });
    config = app.get(ConfigService);
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  afterEach(() => {
    delete process.env.RATE_LIMIT_TUNED_B_COUNT;
  });

  it('takes a changed value on the next request, without a restart (ConfigService.set)', async () => {
    expect(await statuses(app, '/tuned/a', 3)).toEqual([200, 200, 429]);
    config.set('limits.tuned.a.count', 5);
    expect(await statuses(app, '/tuned/a', 4)).toEqual([200, 200, 200, 429]);
    config.set('limits.tuned.a.count', 1);
    const rejected = await request(app.getHttpServer()).get('/tuned/a').expect(429);
    expect(rejected.headers['ratelimit-limit']).toBe('1');
  });

  it('reads env-style names (RATE_LIMIT_<KEY>_COUNT) as they change', async () => {
    process.env.RATE_LIMIT_TUNED_B_COUNT = '3';
    expect(await statuses(app, '/tuned/b', 4)).toEqual([200, 200, 200, 429]);
    process.env.RATE_LIMIT_TUNED_B_COUNT = '4';
    expect(await statuses(app, '/tuned/b', 2)).toEqual([200, 429]);
  });

  it('falls back to the decorator value on an invalid value, warning once per key', async () => {
    config.set('limits.tuned.c.count', 'lots');
    config.set('limits.tuned.c.window', '5 parsecs');
    expect(await statuses(app, '/tuned/c', 5)).toEqual([200, 200, 429, 429, 429]);
    const warnings = logs.at('warn', /tuned\.c/);
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toMatch(
      /'count' = "lots" for 'tuned.c' is invalid; using count 2 per 60000 ms from @RateLimit on TunedController.c/,
    );
    expect(warnings[1]).toMatch(/'window' = "5 parsecs"/);
  });
});

@Injectable()
class MapConfigCentre extends RateLimitConfigCentre {
  readonly values = new Map<string, RateLimitOverride>();
  get(configKey: string) {
    return this.values.get(configKey);
  }
}

describe('a custom config centre', () => {
  let app: INestApplication;

  beforeAll(async () => {
    app = await createTestApp({ controllers: [TunedController], rateLimit: { configCentre: MapConfigCentre } });
  });

  afterAll(() => app?.close());

  it('is created with dependency injection and asked on every request', async () => {
    const centre = app.get(RateLimitConfigCentre);
    expect(centre).toBeInstanceOf(MapConfigCentre);
    (centre as MapConfigCentre).values.set('tuned.a', { count: '1', window: '1h' });
    const first = await request(app.getHttpServer()).get('/tuned/a').expect(200);
    expect(first.headers['ratelimit-reset']).toBe('3600');
    await request(app.getHttpServer()).get('/tuned/a').expect(429);
  });
});

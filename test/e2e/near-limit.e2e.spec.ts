import { Controller, Get, type INestApplication } from '@nestjs/common';
import { RateLimit, RateLimitConfigurationError, type RateLimitNearLimitEvent } from 'nest-rate-limit';
import { rateLimitMetrics } from 'nest-rate-limit/ops';
import { Registry } from 'prom-client';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller()
class QuotaController {
  /** 10 a minute per client; 80% is the 8th request. */
  @Get('quota')
  @RateLimit({ count: 10, window: '1m', nearLimit: 0.8 })
  quota() {
    return 'ok';
  }

  /** Costs 3 units each: the crossing comes by a jump (6 -> 9 of 10). */
  @Get('heavy')
  @RateLimit({ count: 10, window: '1m', cost: 3, nearLimit: 0.8 })
  heavy() {
    return 'ok';
  }

  @Get('plain')
  @RateLimit({ count: 10, window: '1m' })
  plain() {
    return 'ok';
  }
}

async function nearLimitSeries(registry: Registry): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('rate_limit_near_limit_total')!.get();
  return Object.fromEntries(metric.values.map(({ labels, value }) => [String(labels.rule), value]));
}

describeStoresAndPlatforms('nearLimit: warned before the 429', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('counts and hooks the admission that crosses the share, once per identity and window', async () => {
    const registry = new Registry();
    const events: RateLimitNearLimitEvent[] = [];
    app = await createTestApp({
      platform,
      trustProxy: true,
      controllers: [QuotaController],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        extensions: [rateLimitMetrics({ registry })],
        onNearLimit: (event) => void events.push(event),
      },
    });
    // Declared rules with a share are at 0 from the start; rules without one have no series.
    expect(await nearLimitSeries(registry)).toEqual({ 'QuotaController.quota': 0, 'QuotaController.heavy': 0 });

    const get = (path: string, client: string) =>
      request(app!.getHttpServer()).get(path).set('X-Forwarded-For', client);
    for (let i = 1; i <= 7; i += 1) await get('/quota', '198.51.100.1').expect(200);
    expect(events).toEqual([]);
    await get('/quota', '198.51.100.1').expect(200);
    expect(events).toEqual([
      { rule: 'QuotaController.quota', identity: '198.51.100.1', limit: 10, remaining: 2, resetMs: expect.any(Number) },
    ]);
    // Past it, not again; nor when refused.
    for (let i = 0; i < 2; i += 1) await get('/quota', '198.51.100.1').expect(200);
    await get('/quota', '198.51.100.1').expect(429);
    // Another client crosses on its own.
    for (let i = 0; i < 8; i += 1) await get('/quota', '198.51.100.2').expect(200);
    // By a jump: 3, 6, then 9 crosses 8.
    for (let i = 0; i < 3; i += 1) await get('/heavy', '198.51.100.1').expect(200);
    for (let i = 0; i < 10; i += 1) await get('/plain', '198.51.100.1').expect(200);

    expect(events.map(({ rule, identity, remaining }) => [rule, identity, remaining])).toEqual([
      ['QuotaController.quota', '198.51.100.1', 2],
      ['QuotaController.quota', '198.51.100.2', 2],
      ['QuotaController.heavy', '198.51.100.1', 1],
    ]);
    expect(await nearLimitSeries(registry)).toEqual({ 'QuotaController.quota': 2, 'QuotaController.heavy': 1 });
  });

  it('a hook that throws is logged by sampling; requests go on', async () => {
    const logs = new LogCapture();
    app = await createTestApp({
      platform,
      logger: logs,
      trustProxy: true,
      controllers: [QuotaController],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        onNearLimit: () => {
          throw new Error('mailer down');
        },
      },
    });
    for (let c = 1; c <= 5; c += 1) {
      for (let i = 0; i < 8; i += 1) {
        await request(app.getHttpServer()).get('/quota').set('X-Forwarded-For', `198.51.100.${c}`).expect(200);
      }
    }
    expect(logs.at('warn', /onNearLimit failed/)).toEqual([
      'onNearLimit failed (Error: mailer down); requests go on: 1 since last report',
    ]);
  });
});

describe('nearLimit checked at bootstrap', () => {
  it('names the route and the field', async () => {
    @Controller()
    class BadController {
      @Get()
      @RateLimit({ count: 10, window: '1m', nearLimit: 80 })
      get() {
        return 'x';
      }
    }
    const failure = createTestApp({ controllers: [BadController] });
    await expect(failure).rejects.toThrow(RateLimitConfigurationError);
    await expect(createTestApp({ controllers: [BadController] })).rejects.toThrow(
      "@RateLimit on BadController.get: 'nearLimit' must be a share of the limit above 0 and below 1 (0.8: 80%), got 80",
    );
  });
});

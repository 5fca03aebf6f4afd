import { Controller, Get, type INestApplication, UnauthorizedException, UseGuards } from '@nestjs/common';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitConfigurationError, RateLimitModule, type RateLimitModuleOptions } from 'nest-rate-limit';

type RateLimitHeaderStyle = RateLimitModuleOptions['headers'];
import { describePlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller('headers')
@RateLimit({ name: 'route', count: 100, window: '1m', by: 'global' })
class HeadersController {
  @Get()
  @RateLimit({ name: 'client', count: 2, window: '10s' })
  get() {
    return { ok: true };
  }
}

/** Counted first, then refused by an authentication guard that runs after the limiter's. */
@Controller('headers-then-auth')
class AuthAfterLimitController {
  @Get()
  @RateLimit({ count: 2, window: '10s' })
  @UseGuards({
    canActivate: () => {
      throw new UnauthorizedException();
    },
  })
  get() {
    return { ok: true };
  }
}

@Controller('headers-waited')
class WaitedController {
  @Get()
  @RateLimit({ count: 1, window: '300ms', by: 'global', wait: { maxMs: '1s' } })
  get() {
    return { ok: true };
  }
}

const RATE_LIMIT_HEADERS = /^(x-)?ratelimit/;

describePlatforms('rate-limit header styles', (platform) => {
  let app: INestApplication;
  const start = async (headers?: RateLimitHeaderStyle) => {
    app = await createTestApp({
      platform,
      controllers: [HeadersController],
      rateLimit: { keyPrefix: uniquePrefix(), ...(headers === undefined ? {} : { headers }) },
    });
    const http = () => request(app.getHttpServer()).get('/headers');
    const responses = [await http(), await http(), await http()];
    return { admitted: responses[0].headers, rejected: responses[2].headers, status: responses.map((r) => r.status) };
  };

  afterEach(() => app?.close());

  it("'draft-6' (default): the tightest rule's RateLimit-Limit, -Remaining, -Reset", async () => {
    const { admitted, rejected, status } = await start();
    expect(status).toEqual([200, 200, 429]);
    expect(admitted).toMatchObject({ 'ratelimit-limit': '2', 'ratelimit-remaining': '1', 'ratelimit-reset': '10' });
    expect(rejected).toMatchObject({ 'ratelimit-limit': '2', 'ratelimit-remaining': '0', 'retry-after': '10' });
  });

  it("'draft-11': RateLimit-Policy and RateLimit structured fields, one item per rule", async () => {
    const { admitted, rejected } = await start('draft-11');
    expect(admitted['ratelimit-policy']).toBe('"route";q=100;w=60, "client";q=2;w=10');
    expect(admitted['ratelimit']).toBe('"route";r=99;t=60, "client";r=1;t=10');
    expect(admitted['ratelimit-limit']).toBeUndefined();
    // The refused request moved no counter: the route still has 98.
    expect(rejected['ratelimit']).toBe('"route";r=98;t=60, "client";r=0;t=10');
    expect(rejected['retry-after']).toBe('10');
  });

  it("'x-ratelimit': @nestjs/throttler's names", async () => {
    const { admitted, rejected } = await start('x-ratelimit');
    expect(admitted).toMatchObject({
      'x-ratelimit-limit': '2',
      'x-ratelimit-remaining': '1',
      'x-ratelimit-reset': '10',
    });
    expect(admitted['ratelimit-limit']).toBeUndefined();
    expect(rejected).toMatchObject({ 'x-ratelimit-remaining': '0', 'retry-after': '10' });
  });

  it('false: none, but Retry-After on a rejection', async () => {
    const { admitted, rejected } = await start(false);
    expect(Object.keys(admitted).filter((name) => RATE_LIMIT_HEADERS.test(name))).toEqual([]);
    expect(Object.keys(rejected).filter((name) => RATE_LIMIT_HEADERS.test(name))).toEqual([]);
    expect(rejected['retry-after']).toBe('10');
  });
});

describePlatforms('headers of requests refused after the limiter admitted them', (platform) => {
  let app: INestApplication;
  afterEach(() => app?.close());

  it('a 401 from a later guard still says what the counted request left', async () => {
    app = await createTestApp({
      platform,
      controllers: [AuthAfterLimitController],
      rateLimit: { keyPrefix: uniquePrefix() },
    });
    const first = await request(app.getHttpServer()).get('/headers-then-auth');
    expect(first.status).toBe(401);
    expect(first.headers).toMatchObject({ 'ratelimit-limit': '2', 'ratelimit-remaining': '1' });
    const second = await request(app.getHttpServer()).get('/headers-then-auth');
    expect(second.headers).toMatchObject({ 'ratelimit-remaining': '0' });
    expect((await request(app.getHttpServer()).get('/headers-then-auth')).status).toBe(429);
  });
});

describe('the headers option at bootstrap', () => {
  it('refuses an unknown style, naming the field', () => {
    expect(() => RateLimitModule.forRoot({ headers: 'draft-99' as RateLimitHeaderStyle })).toThrow(
      RateLimitConfigurationError,
    );
    expect(() => RateLimitModule.forRoot({ headers: 'draft-99' as RateLimitHeaderStyle })).toThrow(/'headers' must be/);
  });
});

describePlatforms('the time a request waited for room', (platform) => {
  let app: INestApplication;
  afterEach(() => app?.close());

  it('is its Server-Timing: rate-limit-wait, in ms; a request that did not wait has none', async () => {
    app = await createTestApp({ platform, controllers: [WaitedController], rateLimit: { keyPrefix: uniquePrefix() } });
    await app.listen(0, '127.0.0.1');
    const server = app.getHttpServer();
    const [first, second] = await Promise.all([
      request(server).get('/headers-waited'),
      request(server).get('/headers-waited'),
    ]);
    expect([first.status, second.status]).toEqual([200, 200]);
    const timings = [first, second].map((response) => response.headers['server-timing']);
    expect(timings.filter((timing) => timing === undefined)).toHaveLength(1);
    const waited = /^rate-limit-wait;dur=(\d+)$/.exec(timings.find((timing) => timing !== undefined)!);
    expect(Number(waited![1])).toBeGreaterThanOrEqual(200);
    expect(Number(waited![1])).toBeLessThan(1_000);
  });
});

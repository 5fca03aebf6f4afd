import { Controller, Get, type INestApplication, UseGuards } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { RateLimit, RateLimitGuard, SkipRateLimit } from 'nest-rate-limit';
import { describePlatforms, describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller('limited')
class LimitedController {
  @Get()
  @RateLimit({ count: 3, window: '1s' })
  get() {
    return { ok: true };
  }

  @Get('free')
  @SkipRateLimit()
  free() {
    return { ok: true };
  }

  @Get('twice')
  @UseGuards(RateLimitGuard)
  @RateLimit(3, '10s')
  guardedTwice() {
    return { ok: true };
  }
}

@Controller('multi')
@RateLimit({ name: 'multi-minute', count: 3, window: '1m' })
class MultiController {
  @Get()
  @RateLimit({ name: 'multi-second', count: 1, window: '1s' })
  get() {
    return {};
  }
}

@Controller('shop')
@RateLimit({ name: 'shop', count: 4, window: '10s', by: 'global' })
class ShopController {
  @Get('list')
  list() {
    return [];
  }

  @Get('item')
  @RateLimit({ name: 'shop', count: 2, window: '10s', by: 'global' })
  item() {
    return {};
  }

  @Get('search')
  @RateLimit({ count: 1, window: '10s' })
  search() {
    return [];
  }

  @Get('catalogue')
  @SkipRateLimit('shop')
  @RateLimit({ count: 2, window: '10s' })
  catalogue() {
    return [];
  }
}

// Time comes from the module's `clock` option, driven by a fake Date, so windows end when the test says.
describeStoresAndPlatforms('rate limiting over HTTP', (store, platform) => {
  let app: INestApplication;

  beforeAll(async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    app = await createTestApp({
      platform,
      controllers: [LimitedController, ShopController, MultiController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), clock: () => Date.now() },
    });
  });

  afterAll(async () => {
    vi.useRealTimers();
    await app?.close();
  });

  it('admits 3 per second, then answers 429 with Retry-After, the headers and the JSON body, then admits again', async () => {
    const http = request(app.getHttpServer());
    for (const remaining of [2, 1, 0]) {
      const ok = await http.get('/limited').expect(200);
      expect(ok.headers['ratelimit-limit']).toBe('3');
      expect(ok.headers['ratelimit-remaining']).toBe(String(remaining));
      expect(ok.headers['ratelimit-reset']).toBe('1');
      expect(ok.headers['retry-after']).toBeUndefined();
    }

    const rejected = await http.get('/limited').expect(429);
    expect(rejected.headers['retry-after']).toBe('1');
    expect(rejected.headers['ratelimit-limit']).toBe('3');
    expect(rejected.headers['ratelimit-remaining']).toBe('0');
    expect(rejected.headers['ratelimit-reset']).toBe('1');
    expect(rejected.headers['content-type']).toMatch(/application\/json/);
    expect(rejected.body).toEqual({
      statusCode: 429,
      error: 'Too Many Requests',
      message: expect.any(String),
      retryAfter: 1,
    });

    vi.setSystemTime(Date.now() + 1_000);
    const again = await http.get('/limited').expect(200);
    expect(again.headers['ratelimit-remaining']).toBe('2');
  });

  it('leaves @SkipRateLimit() handlers alone', async () => {
    const http = request(app.getHttpServer());
    for (let i = 0; i < 10; i += 1) {
      const response = await http.get('/limited/free').expect(200);
      expect(response.headers['ratelimit-limit']).toBeUndefined();
    }
  });

  it('counts a request once when the guard is registered globally and with @UseGuards', async () => {
    const http = request(app.getHttpServer());
    const remaining = [];
    for (let i = 0; i < 3; i += 1) {
      remaining.push((await http.get('/limited/twice').expect(200)).headers['ratelimit-remaining']);
    }
    expect(remaining).toEqual(['2', '1', '0']);
    await http.get('/limited/twice').expect(429);
  });

  it('applies class rules to every handler, lets a handler rule of the same name replace one, and adds others', async () => {
    const http = request(app.getHttpServer());
    // 'shop' is one counter for the controller: item (limit 2) and list (limit 4) share it.
    await http.get('/shop/item').expect(200);
    await http.get('/shop/item').expect(200);
    const itemRejected = await http.get('/shop/item').expect(429);
    expect(itemRejected.headers['ratelimit-limit']).toBe('2');
    await http.get('/shop/list').expect(200);
    await http.get('/shop/list').expect(200);
    await http.get('/shop/list').expect(429);

    // search carries the class rule 'shop' (exhausted) and its own rule (1 per 10 s per IP).
    const searchRejected = await http.get('/shop/search').expect(429);
    expect(searchRejected.headers['ratelimit-limit']).toBe('4');
    // The rejected request moved no counter: search's own rule still has its one unit.
    vi.setSystemTime(Date.now() + 10_000);
    const searchAdmitted = await http.get('/shop/search').expect(200);
    expect(searchAdmitted.headers['ratelimit-remaining']).toBe('0');
    expect(searchAdmitted.headers['ratelimit-limit']).toBe('1');
  });

  it('skips only the named rule with @SkipRateLimit(name)', async () => {
    const http = request(app.getHttpServer());
    // The class rule 'shop' (4 per 10 s, global) does not apply here; the handler's own rule does.
    const first = await http.get('/shop/catalogue').expect(200);
    expect(first.headers['ratelimit-limit']).toBe('2');
    await http.get('/shop/catalogue').expect(200);
    const rejected = await http.get('/shop/catalogue').expect(429);
    expect(rejected.body.message).toContain("'ShopController.catalogue'");
  });

  it('moves no counter when one rule rejects, and reports the longest wait when several do', async () => {
    const http = request(app.getHttpServer());
    // Class rule: 3 per minute; handler rule: 1 per second.
    await http.get('/multi').expect(200);
    const second = await http.get('/multi').expect(429);
    expect(second.headers['ratelimit-limit']).toBe('1');
    vi.setSystemTime(Date.now() + 1_000);
    // Had the rejected request counted on the class rule, only one unit would be left here.
    const third = await http.get('/multi').expect(200);
    expect(third.headers['ratelimit-remaining']).toBe('0');
    const fourth = await http.get('/multi').expect(429);
    expect(fourth.headers['ratelimit-limit']).toBe('1');
    vi.setSystemTime(Date.now() + 1_000);
    await http.get('/multi').expect(200);
    // Now both rules reject: the minute rule's wait (about 58 s) wins over the second rule's (1 s).
    const both = await http.get('/multi').expect(429);
    expect(both.headers['ratelimit-limit']).toBe('3');
    expect(Number(both.headers['retry-after'])).toBeGreaterThan(50);
    expect(both.body.retryAfter).toBe(Number(both.headers['retry-after']));
    expect(both.body.message).toContain("'multi-minute'");
  });
});

@Controller('client')
class ClientController {
  @Get()
  @RateLimit(1, '1h')
  get() {
    return {};
  }
}

describePlatforms('the client address', (platform) => {
  it('is the forwarded client when the app trusts its proxy', async () => {
    const app = await createTestApp({ platform, trustProxy: true, controllers: [ClientController] });
    try {
      const http = request(app.getHttpServer());
      await http.get('/client').set('X-Forwarded-For', '198.51.100.1').expect(200);
      await http.get('/client').set('X-Forwarded-For', '198.51.100.2').expect(200);
      await http.get('/client').set('X-Forwarded-For', '198.51.100.1').expect(429);
      // One /64 is one client: rotating the interface identifier does not escape the limit.
      await http.get('/client').set('X-Forwarded-For', '2001:db8:7:7::1').expect(200);
      await http.get('/client').set('X-Forwarded-For', '2001:db8:7:7:ffff::2').expect(429);
    } finally {
      await app.close();
    }
  });

  it('ignores X-Forwarded-For when the app does not trust a proxy', async () => {
    const app = await createTestApp({ platform, controllers: [ClientController] });
    try {
      const http = request(app.getHttpServer());
      await http.get('/client').set('X-Forwarded-For', '198.51.100.1').expect(200);
      await http.get('/client').set('X-Forwarded-For', '198.51.100.2').expect(429);
    } finally {
      await app.close();
    }
  });
});

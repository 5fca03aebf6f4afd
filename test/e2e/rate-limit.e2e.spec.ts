import { Controller, Get, type INestApplication, UseGuards } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { RateLimit, RateLimitGuard, SkipRateLimit } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
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
}

interface StoreUnderTest {
  name: string;
  setUp(): Promise<{ redis?: string; prefix: string }>;
  /** Resolves once the window of `keyPattern`'s counter is over. */
  endWindow(keyPrefix: string): Promise<void>;
  tearDown(): Promise<void>;
}

let server: RedisServer | undefined;
let subscriber: Redis | undefined;

const redisStore: StoreUnderTest = {
  name: 'Redis',
  async setUp() {
    server ??= await startRedisServer(['--notify-keyspace-events', 'Ex']);
    return { redis: server.url, prefix: uniquePrefix() };
  },
  // The counter's TTL is Redis's clock; wait for its expiry event rather than sleeping.
  endWindow(keyPrefix) {
    subscriber ??= server!.client();
    const events = subscriber;
    return new Promise<void>((resolve) => {
      const onMessage = (_channel: string, key: string) => {
        if (key.startsWith(keyPrefix)) {
          events.off('message', onMessage);
          resolve();
        }
      };
      events.on('message', onMessage);
      void events.subscribe('__keyevent@0__:expired');
    });
  },
  async tearDown() {
    await server?.stop();
    server = undefined;
    subscriber = undefined;
  },
};

const memoryStore: StoreUnderTest = {
  name: 'embedded memory',
  setUp() {
    vi.useFakeTimers({ toFake: ['Date'] });
    return Promise.resolve({ prefix: uniquePrefix() });
  },
  endWindow() {
    vi.setSystemTime(Date.now() + 1_000);
    return Promise.resolve();
  },
  tearDown() {
    vi.useRealTimers();
    return Promise.resolve();
  },
};

describe.each([redisStore, memoryStore])('rate limiting over HTTP with the $name store', (store) => {
  let app: INestApplication;
  let prefix: string;

  beforeAll(async () => {
    const setting = await store.setUp();
    prefix = setting.prefix;
    app = await createTestApp({
      controllers: [LimitedController, ShopController],
      rateLimit: { redis: setting.redis, keyPrefix: prefix },
    });
  });

  afterAll(async () => {
    await app?.close();
    await store.tearDown();
  });

  afterEach(() => vi.clearAllMocks());

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

    await store.endWindow(`${prefix}:LimitedController.get:`);
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

    // search carries the class rule 'shop' (exhausted) and its own rule; the 429 names the tighter wait.
    const searchRejected = await http.get('/shop/search').expect(429);
    expect(searchRejected.headers['ratelimit-limit']).toBe('4');
  });
});

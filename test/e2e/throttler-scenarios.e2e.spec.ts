import {
  Controller,
  type ExecutionContext,
  Get,
  HttpException,
  type INestApplication,
  Injectable,
  Post,
  type Type,
} from '@nestjs/common';
import { APP_GUARD } from '@nestjs/core';
import { RateLimit, RateLimitGuard, SkipRateLimit, type RuleDecision } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/**
 * The scenarios of `@nestjs/throttler`'s own end-to-end suite (its test app: a default for every
 * route, class and route overrides, skips, ignored user agents, `skipIf`, named throttlers and their
 * headers, limits from the request, a custom error), written here as docs/migrating-from-throttler.md
 * maps each option, on both stores and both HTTP adapters. Where a figure differs from throttler's,
 * the guide says so ("Throttler's own scenarios"). Time is a clock the test moves: no waiting.
 */

class TestClock {
  now = Date.now();
  readonly read = () => this.now;
}

const success = { success: true };

/** `@Throttle({ default: { limit: 2 } })` on a route: the default's name, its own count. */
@Controller()
class AppController {
  @Get()
  @RateLimit({ name: 'default', count: 2, window: '1m' })
  throttled() {
    return success;
  }

  @Get('ignored')
  @SkipRateLimit()
  ignored() {
    return { ignored: true };
  }

  @Get('ignore-user-agents')
  ignoreUserAgents() {
    return { ignored: true };
  }
}

/** Class values (`limit: 2`, 10 s, blocked 20 s), and a route's own (`limit: 5`). */
@Controller('limit')
@RateLimit({ name: 'default', count: 2, window: '10s', blockFor: '20s' })
class LimitController {
  @Get()
  throttled() {
    return success;
  }

  @Get('higher')
  @RateLimit({ name: 'default', count: 5, window: '10s', blockFor: '20s' })
  higher() {
    return success;
  }
}

/** No decorator: the module's default. */
@Controller('default')
class DefaultController {
  @Get()
  get() {
    return success;
  }
}

/** 1 a second, blocked a second. */
@Controller('test/throttle')
class ThrottleTestController {
  @Post()
  @RateLimit({ name: 'default', count: 1, window: '1s', blockFor: '1s' })
  post() {
    return { code: 'THROTTLE_TEST' };
  }
}

const CONTROLLERS = [AppController, LimitController, DefaultController, ThrottleTestController];

describeStoresAndPlatforms("@nestjs/throttler's scenarios", (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  /** throttler's `ThrottlerModule.forRoot({ limit: 5, ttl: 60, ignoreUserAgents })`, with its header names. */
  async function start(
    clock: TestClock,
    extra: object = {},
    controllers: Type[] = CONTROLLERS,
  ): Promise<INestApplication> {
    app = await createTestApp({
      platform,
      controllers,
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        clock: clock.read,
        headers: 'x-ratelimit',
        defaults: [{ count: 5, window: '1m' }],
        // throttler's `ignoreUserAgents`, with the networks the test's clients come from.
        allow: { userAgents: [{ agent: /throttler-test/g, from: ['127.0.0.0/8', '::1'] }] },
        ...extra,
      },
    });
    return app;
  }

  const get = (path: string, headers: Record<string, string> = {}) =>
    request(app!.getHttpServer()).get(path).set(headers);

  it('AppController: a skipped route and an ignored user agent get no headers; a route override counts', async () => {
    await start(new TestClock());
    const ignored = await get('/ignored');
    expect([ignored.body, ignored.headers['x-ratelimit-limit']]).toEqual([{ ignored: true }, undefined]);
    const agent = await get('/ignore-user-agents', { 'user-agent': 'throttler-test/0.0.0' });
    expect([agent.body, agent.headers['x-ratelimit-limit']]).toEqual([{ ignored: true }, undefined]);
    const counted = await get('/');
    expect(counted.body).toEqual(success);
    expect(counted.headers).toMatchObject({
      'x-ratelimit-limit': '2',
      'x-ratelimit-remaining': '1',
      'x-ratelimit-reset': expect.stringMatching(/^\d+$/),
    });
  });

  it.each([
    { path: '/limit', limit: 2 },
    { path: '/limit/higher', limit: 5 },
  ])(
    'LimitController $path: counts down, 429 with Retry-After, admitted again once the block ends',
    async ({ path, limit }) => {
      const clock = new TestClock();
      await start(clock);
      for (let i = 0; i < limit; i += 1) {
        const response = await get(path);
        expect(response.body).toEqual(success);
        expect(response.headers).toMatchObject({
          'x-ratelimit-limit': String(limit),
          'x-ratelimit-remaining': String(limit - (i + 1)),
        });
      }
      const refused = await get(path);
      expect(refused.status).toBe(429);
      expect(refused.body).toMatchObject({ statusCode: 429 });
      expect(refused.headers['retry-after']).toMatch(/^\d+$/);
      clock.now += 20_000; // blockDuration
      const again = await get(path);
      expect(again.body).toEqual(success);
      expect(again.headers).toMatchObject({
        'x-ratelimit-limit': String(limit),
        'x-ratelimit-remaining': String(limit - 1),
      });
    },
  );

  it('DefaultController: the module default, 5 a minute', async () => {
    const clock = new TestClock();
    await start(clock);
    for (let i = 0; i < 5; i += 1) {
      expect((await get('/default')).headers['x-ratelimit-remaining']).toBe(String(4 - i));
    }
    const refused = await get('/default');
    expect([refused.status, refused.headers['retry-after']]).toEqual([429, expect.stringMatching(/^\d+$/)]);
    clock.now += 60_000;
    const again = await get('/default');
    expect([again.status, again.headers['x-ratelimit-remaining']]).toEqual([200, '4']);
  });

  it('ThrottleTestController: 1 a second: 201, a second later 201, then 429, 429', async () => {
    const clock = new TestClock();
    await start(clock);
    const post = () => request(app!.getHttpServer()).post('/test/throttle');
    expect((await post()).status).toBe(201);
    clock.now += 1_000;
    expect([(await post()).status, (await post()).status, (await post()).status]).toEqual([201, 429, 429]);
  });

  it('skipIf: a module skipIf that says true lets every request through, without headers', async () => {
    await start(new TestClock(), { skipIf: () => true });
    for (let i = 0; i < 15; i += 1) {
      const response = await get('/');
      expect([response.status, response.headers['x-ratelimit-limit']]).toEqual([200, undefined]);
    }
  });

  @Controller()
  class MultiThrottlerController {
    @Get()
    simpleRoute() {
      return success;
    }

    @Get('skip-short')
    @SkipRateLimit('short')
    skipShort() {
      return success;
    }

    @Get('skip-default-and-long')
    @SkipRateLimit('default', 'long')
    skipDefaultAndLong() {
      return success;
    }
  }

  /** The remaining count of each rule, from the draft-11 `RateLimit` header (one item per rule). */
  const remaining = (header: string | undefined): Record<string, number> =>
    Object.fromEntries(
      (header ?? '')
        .split(', ')
        .filter(Boolean)
        .map((item) => {
          const [name, r] = /^"([^"]+)";r=(\d+)/.exec(item)!.slice(1);
          return [name, Number(r)];
        }),
    );

  it('named throttlers (default 2 per 5 s, long 5 a minute, short 1 a second): the same admissions, one header item per rule', async () => {
    const clock = new TestClock();
    await start(
      clock,
      {
        headers: 'draft-11',
        defaults: [
          { name: 'default', count: 2, window: '5s' },
          { name: 'long', count: 5, window: '1m' },
          { name: 'short', count: 1, window: '1s' },
        ],
      },
      [MultiThrottlerController],
    );
    const at = async (seconds: number) => {
      clock.now += seconds * 1_000;
      const response = await get('/');
      return { status: response.status, left: remaining(response.headers.ratelimit as string | undefined) };
    };
    expect(await at(0)).toMatchObject({ status: 200, left: { short: 0 } });
    expect((await at(0)).status).toBe(429); // short
    expect(await at(1)).toMatchObject({ status: 200, left: { default: 0 } });
    expect((await at(1)).status).toBe(429); // default
    expect(await at(5)).toMatchObject({ status: 200, left: { long: 2, short: 0 } });
    expect(await at(1)).toMatchObject({ status: 200, left: { default: 0 } });
    expect(await at(5)).toMatchObject({ status: 200, left: { long: 0, short: 0, default: 1 } });
    expect((await at(1)).status).toBe(429); // long

    const skipShort = [await get('/skip-short'), await get('/skip-short')];
    expect(skipShort.map((response) => remaining(response.headers.ratelimit as string).default)).toEqual([1, 0]);
    const skipOthers = remaining((await get('/skip-default-and-long')).headers.ratelimit as string);
    expect(skipOthers).toEqual({ short: 0 });
  });

  it('limit and ttl from the request (throttler: functions of the context): a tier per request', async () => {
    @Controller('function-overrides')
    class FunctionOverridesController {
      @Get()
      @RateLimit({
        name: 'default',
        count: 2,
        window: '1m',
        tiers: {
          of: (context: ExecutionContext) =>
            context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tier'],
          limits: { generous: { count: 4, window: '1m' } },
        },
      })
      get() {
        return success;
      }
    }
    await start(new TestClock(), {}, [FunctionOverridesController]);
    const statuses = async (n: number, headers: Record<string, string> = {}) => {
      const seen: number[] = [];
      for (let i = 0; i < n; i += 1) seen.push((await get('/function-overrides', headers)).status);
      return seen;
    };
    expect(await statuses(3)).toEqual([200, 200, 429]);
    // The same counter (as throttler keys it), a higher limit: 2 more.
    expect(await statuses(3, { 'x-tier': 'generous' })).toEqual([200, 200, 429]);
  });
});

/** throttler's `errorMessage` / `getErrorMessage`: here a guard subclass's `createException`. */
@Injectable()
class CustomMessageGuard extends RateLimitGuard {
  protected override createException(rejected: RuleDecision): Error {
    return new HttpException(`Custom: ${rejected.rule.name} refused`, 429);
  }
}

describeStoresAndPlatforms("@nestjs/throttler's custom error message", (store, platform) => {
  it('answers the message the app gives', async () => {
    const app = await createTestApp({
      platform,
      controllers: [DefaultController],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        globalGuard: false,
        defaults: [{ count: 1, window: '1m' }],
      },
      providers: [{ provide: APP_GUARD, useClass: CustomMessageGuard }],
    });
    try {
      await request(app.getHttpServer()).get('/default').expect(200);
      const refused = await request(app.getHttpServer()).get('/default').expect(429);
      expect(refused.body).toEqual({ statusCode: 429, message: 'Custom: default refused' });
    } finally {
      await app.close();
    }
  });
});

import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  Injectable,
  type Type,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GraphQLModule, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import {
  RateLimit,
  RateLimitConfigurationError,
  RateLimitModule,
  type RateLimitModuleExtras,
  RateLimiterService,
  SkipRateLimit,
} from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStores, describeStoresAndPlatforms } from '../support/matrix.js';
import { connectSocket, disconnectSockets, sendMessage } from '../support/socket.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

/** Handlers as an app adds them: most without a decorator, some that say otherwise. */
@Controller()
class ShopController {
  @Get('a')
  a() {
    return 'a';
  }

  @Get('b')
  b() {
    return 'b';
  }

  /** Its own rule of the default's name: it replaces the default here. */
  @Get('roomy')
  @RateLimit({ name: 'default', count: 4, window: '1m' })
  roomy() {
    return 'roomy';
  }

  @Get('health')
  @SkipRateLimit()
  health() {
    return 'ok';
  }
}

/** A class rule of the default's name replaces its thresholds on each handler of the class, each counted per route. */
@Controller('admin')
@RateLimit({ name: 'default', count: 3, window: '1m' })
class AdminController {
  @Get('x')
  x() {
    return 'x';
  }

  @Get('y')
  y() {
    return 'y';
  }
}

describeStoresAndPlatforms('forRoot({ defaults })', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  /** The shop (and what else is given) under these defaults, on this store and platform. */
  async function shop(
    defaults: NonNullable<RateLimitModuleExtras['defaults']>,
    controllers: Type[] = [ShopController],
  ): Promise<INestApplication> {
    app = await createTestApp({
      platform,
      controllers,
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), defaults },
    });
    return app;
  }

  it('limits every route without a decorator, each on a counter of its own, as throttler counts', async () => {
    const logs = new LogCapture();
    app = await createTestApp({
      platform,
      logger: logs,
      controllers: [ShopController, AdminController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), defaults: [{ count: 2, window: '1m' }] },
    });
    expect(await statuses(app, '/a', 3)).toEqual([200, 200, 429]);
    // Per route: /b has its own 2.
    expect(await statuses(app, '/b', 3)).toEqual([200, 200, 429]);
    const refused = await request(app.getHttpServer()).get('/a');
    expect(refused.headers['retry-after']).toBeDefined();
    expect(refused.body).toMatchObject({ statusCode: 429, message: expect.stringContaining("'default'") });
    // A rule of the same name replaces the default; @SkipRateLimit() exempts.
    expect(await statuses(app, '/roomy', 5)).toEqual([200, 200, 200, 200, 429]);
    expect(await statuses(app, '/health', 5)).toEqual([200, 200, 200, 200, 200]);
    // The class rule of that name: 3 per route (the default counts per route), its own counter
    // apart from /roomy's, which gives the same name.
    expect(await statuses(app, '/admin/x', 4)).toEqual([200, 200, 200, 429]);
    expect(await statuses(app, '/admin/y', 1)).toEqual([200]);
    // Said at the start: what the default covers.
    expect(logs.at('log', /^Default rules:/)).toEqual([
      "Default rules: 'default' (2 per 60000 ms, per route) covers 2 of 6 handlers (3 replace it, 1 skip it)",
    ]);
  });

  it('a default with settleCost: every route settles its real cost after the handler', async () => {
    // 10 reserved, the characters answered charged: 'a' costs 1.
    const app = await shop([
      { count: 100, window: '1m', cost: 10, settleCost: { actual: (result) => String(result).length, max: 50 } },
    ]);
    // Reservations alone would admit 10.
    expect(await statuses(app, '/a', 30)).toEqual(Array.from({ length: 30 }, () => 200));
  });

  it("counted per route: inspected by one route's name ('Route#name'), reset on every route by its own", async () => {
    app = await shop([{ count: 2, window: '1m' }]);
    expect([...(await statuses(app, '/a', 3)), ...(await statuses(app, '/b', 1))]).toEqual([200, 200, 429, 200]);
    const limiter = app.get(RateLimiterService);
    const client = '::ffff:127.0.0.1';
    expect((await limiter.inspect('ShopController.a#default', client)).remaining).toBe(0);
    expect((await limiter.inspect('ShopController.b#default', client)).remaining).toBe(1);
    // The plain name stands for a counter per route: which one is asked.
    await expect(limiter.inspect('default', client)).rejects.toThrow(
      'The rule named "default" counts per route: name one route\'s counter, as "ShopController.',
    );
    await limiter.reset('default', client);
    expect([...(await statuses(app, '/a', 2)), ...(await statuses(app, '/b', 2))]).toEqual([200, 200, 200, 200]);
  });

  it("scope 'app': one counter per client for every route it covers", async () => {
    app = await shop([{ count: 3, window: '1m', scope: 'app' }]);
    expect([...(await statuses(app, '/a', 2)), ...(await statuses(app, '/b', 2))]).toEqual([200, 200, 200, 429]);
  });

  it("several named defaults: @SkipRateLimit('name') skips one of them on a route", async () => {
    @Controller()
    class TwoController {
      @Get('both')
      both() {
        return 'both';
      }

      @Get('long-only')
      @SkipRateLimit('short')
      longOnly() {
        return 'long';
      }
    }
    app = await shop(
      [
        { name: 'short', count: 1, window: '1m' },
        { name: 'long', count: 3, window: '1m' },
      ],
      [TwoController],
    );
    expect(await statuses(app, '/both', 2)).toEqual([200, 429]);
    expect(await statuses(app, '/long-only', 4)).toEqual([200, 200, 200, 429]);
  });
});

interface AuthenticatedRequest {
  headers: Record<string, string | undefined>;
  user?: { id: string };
}

@Injectable()
class AuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<AuthenticatedRequest>();
    const [scheme, user] = req.headers.authorization?.split(' ') ?? [];
    if (scheme !== 'Bearer' || !user) throw new UnauthorizedException();
    req.user = { id: user };
    return true;
  }
}

@Controller('me')
@UseGuards(AuthGuard)
class MeController {
  @Get()
  me() {
    return 'me';
  }
}

describeStores('a default counted per user', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it("is decided after the app's auth guard, on routes that do not mention it", async () => {
    app = await createTestApp({
      controllers: [MeController],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        defaults: [
          {
            count: 1,
            window: '1m',
            by: (context) => context.switchToHttp().getRequest<AuthenticatedRequest>().user?.id,
          },
        ],
      },
    });
    const as = (user: string) => request(app!.getHttpServer()).get('/me').set('Authorization', `Bearer ${user}`);
    await as('ann').expect(200);
    await as('bob').expect(200);
    await as('ann').expect(429);
    // Unauthenticated: the auth guard's 401, not a shared anonymous 429.
    await request(app.getHttpServer()).get('/me').expect(401);
  });
});

@Resolver()
class NewsResolver {
  @Query(() => String)
  headline() {
    return 'news';
  }
}

@WebSocketGateway()
class PingGateway {
  @SubscribeMessage('ping')
  ping() {
    return 'pong';
  }
}

describeStores('defaults on GraphQL operations and gateway messages', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    disconnectSockets();
    await app?.close();
    app = undefined;
  });

  it('limits a query and a WebSocket message that carry no decorator', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
        RateLimitModule.forRoot({
          redis: await store.redis(),
          keyPrefix: uniquePrefix(),
          defaults: [{ count: 1, window: '1m' }],
        }),
      ],
      providers: [NewsResolver, PingGateway],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');

    const query = () => request(app!.getHttpServer()).post('/graphql').send({ query: '{ headline }' });
    expect((await query()).body).toEqual({ data: { headline: 'news' } });
    const refused = await query();
    expect(refused.body.errors[0].extensions).toMatchObject({ code: 'RATE_LIMITED', rule: 'default' });

    const socket = await connectSocket(await app.getUrl());
    const send = () => sendMessage(socket, 'ping');
    expect(await send()).toEqual({ ack: 'pong' });
    expect(await send()).toMatchObject({ exception: { status: 'error', rule: 'default' } });
  });
});

describe('defaults checked at bootstrap', () => {
  it('names the default and the field of a bad value', () => {
    expect(() => RateLimitModule.forRoot({ defaults: [{ count: 0, window: '1m' }] })).toThrow(
      "RateLimitModule defaults[0]: 'count' must be a positive whole number, got 0",
    );
    expect(() =>
      RateLimitModule.forRoot({
        defaults: [
          { count: 1, window: '1s' },
          { count: 100, window: '1m' },
        ],
      }),
    ).toThrow(/defaults\[0\]: 'name' is needed when there are several defaults/);
    expect(() => RateLimitModule.forRoot({ defaults: [{ count: 1, window: '1m', scope: 'tenant' as 'app' }] })).toThrow(
      RateLimitConfigurationError,
    );
  });

  it("refuses @SkipRateLimit('name') naming no rule, defaults included", async () => {
    @Controller()
    class TypoController {
      @Get()
      @SkipRateLimit('defualt')
      get() {
        return 'x';
      }
    }
    await expect(
      createTestApp({ controllers: [TypoController], rateLimit: { defaults: [{ count: 1, window: '1m' }] } }),
    ).rejects.toThrow(
      `@SkipRateLimit on TypoController.get: 'ruleNames' ["defualt"] match no rule here (rules: ["default"])`,
    );
  });

  it('takes defaults beside the factory of forRootAsync, not from it', async () => {
    const build = (module: ReturnType<typeof RateLimitModule.forRootAsync>) =>
      Test.createTestingModule({ imports: [module], controllers: [ShopController] }).compile();
    const fromFactory = RateLimitModule.forRootAsync({
      useFactory: () => ({ defaults: [{ count: 1, window: '1m' }] }) as object,
    });
    await expect(build(fromFactory)).rejects.toThrow(
      "RateLimitModule options: 'defaults' shapes the module (which routes are limited): give it to forRootAsync itself, beside 'useFactory'",
    );
    const beside = await build(
      RateLimitModule.forRootAsync({
        useFactory: () => ({ keyPrefix: uniquePrefix() }),
        defaults: [{ count: 1, window: '1m' }],
      }),
    );
    const app = beside.createNestApplication({ logger: false });
    await app.init();
    try {
      expect(await statuses(app, '/a', 2)).toEqual([200, 429]);
    } finally {
      await app.close();
    }
  });
});

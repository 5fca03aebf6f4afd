import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  Injectable,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { GqlExecutionContext, GraphQLModule, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitModule } from 'nest-rate-limit';
import {
  MemoryConfigCentre,
  RateLimitManagementService,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStores, describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

interface Customer {
  id: string;
  plan?: string;
}
interface AuthenticatedRequest {
  headers: Record<string, string | undefined>;
  user?: Customer;
}

/** `Authorization: Bearer <user>:<plan>` sets `req.user` as a real auth guard would from a token. */
@Injectable()
class AuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<AuthenticatedRequest>();
    const [scheme, token] = req.headers.authorization?.split(' ') ?? [];
    if (scheme !== 'Bearer' || !token) throw new UnauthorizedException();
    const [id, plan] = token.split(':');
    req.user = { id, plan: plan || undefined };
    return true;
  }
}

const customer = (context: ExecutionContext) => context.switchToHttp().getRequest<AuthenticatedRequest>().user;

@Controller('reports')
@UseGuards(AuthGuard)
class ReportsController {
  /** Free: 2 a minute (the rule's own count); pro: 4; partner: 6 per 2 minutes. */
  @Get()
  @RateLimit({
    count: 2,
    window: '1m',
    configKey: 'reports',
    by: (context) => customer(context)?.id,
    tiers: { of: (context) => customer(context)?.plan, limits: { pro: 4, partner: { count: 6, window: '2m' } } },
  })
  list() {
    return [];
  }
}

/** Statuses of `n` reports asked for with `token`. */
const reports = (app: INestApplication, token: string, n: number) =>
  statuses(app, '/reports', n, { Authorization: `Bearer ${token}` });

describeStoresAndPlatforms('limits per plan (tiers)', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('counts each customer under the limit of its plan; no plan, or an unknown one, gets the rule count', async () => {
    const logs = new LogCapture();
    app = await createTestApp({
      platform,
      logger: logs,
      controllers: [ReportsController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    expect(await reports(app, 'ann:free', 3)).toEqual([200, 200, 429]);
    expect(await reports(app, 'bob:pro', 5)).toEqual([200, 200, 200, 200, 429]);
    expect(await reports(app, 'cid:partner', 7)).toEqual([200, 200, 200, 200, 200, 200, 429]);
    expect(await reports(app, 'dee', 3)).toEqual([200, 200, 429]);
    expect(await reports(app, 'eve:gold', 3)).toEqual([200, 200, 429]);
    const headers = (await request(app.getHttpServer()).get('/reports').set('Authorization', 'Bearer fay:pro')).headers;
    expect([headers['ratelimit-limit'], headers['ratelimit-remaining']]).toEqual(['4', '3']);
    // Said once, however many requests name it.
    expect(logs.at('warn', /'tiers.of' returned "gold"/)).toHaveLength(1);
  });

  it('keeps what a customer used when its plan changes in the window', async () => {
    app = await createTestApp({
      platform,
      controllers: [ReportsController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    expect(await reports(app, 'ann:free', 3)).toEqual([200, 200, 429]);
    // Upgraded: 4 in all, 2 of them used.
    expect(await reports(app, 'ann:pro', 3)).toEqual([200, 200, 429]);
  });
});

describeStores('a tier changed live', (store) => {
  it('reads <configKey>.<tier> from the config centre, checked as the decorator is', async () => {
    const redis = await store.redis();
    const app = await createTestApp({
      controllers: [ReportsController],
      rateLimit: {
        redis,
        keyPrefix: uniquePrefix(),
        configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
        extensions: [rateLimitManagement()],
      },
    });
    try {
      const management = app.get(RateLimitManagementService);
      await management.set('reports.pro', { count: 1 });
      expect(await reports(app, 'bob:pro', 2)).toEqual([200, 429]);
      expect(await reports(app, 'ann:free', 3)).toEqual([200, 200, 429]);
      await expect(management.set('reports.pro', { count: 0 })).rejects.toThrow(
        "'count' must be a positive whole number",
      );
    } finally {
      await app.close();
    }
  });
});

@Resolver()
class SearchResolver {
  @Query(() => String)
  @RateLimit({
    count: 1,
    window: '1m',
    by: 'ip',
    tiers: {
      of: (context) =>
        GqlExecutionContext.create(context).getContext<{ req: AuthenticatedRequest }>().req.headers['x-plan'],
      limits: { pro: 3 },
    },
  })
  search() {
    return 'found';
  }
}

describe('tiers on a GraphQL operation', () => {
  it('picks the limit per request', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
        RateLimitModule.forRoot({ keyPrefix: uniquePrefix() }),
      ],
      providers: [SearchResolver],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    try {
      const search = async () =>
        (await request(app.getHttpServer()).post('/graphql').set('x-plan', 'pro').send({ query: '{ search }' })).body;
      expect([await search(), await search(), await search()]).toEqual(
        Array.from({ length: 3 }, () => ({ data: { search: 'found' } })),
      );
      expect((await search()).errors[0].extensions).toMatchObject({ code: 'RATE_LIMITED' });
    } finally {
      await app.close();
    }
  });
});

describe('tiers checked at bootstrap', () => {
  it('names the route, the tier and the field', async () => {
    @Controller()
    class BadController {
      @Get()
      @RateLimit({ count: 1, window: '1m', tiers: { of: () => 'pro', limits: { pro: 0 } } })
      get() {
        return 'x';
      }

      @Get('no-resolver')
      @RateLimit({ count: 1, window: '1m', tiers: { limits: { pro: 5 } } as never })
      noResolver() {
        return 'x';
      }
    }
    await expect(createTestApp({ controllers: [BadController] })).rejects.toThrow(
      "@RateLimit on BadController.get, tier 'pro': 'count' must be a positive whole number, got 0",
    );
    await expect(createTestApp({ controllers: [BadController] })).rejects.toThrow(
      "@RateLimit on BadController.noResolver: 'tiers.of' must be a function of the ExecutionContext naming one of 'tiers.limits', got undefined",
    );
  });
});

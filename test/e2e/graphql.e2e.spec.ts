import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import {
  type CanActivate,
  type ExecutionContext,
  type INestApplication,
  Injectable,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import {
  Args,
  GqlExecutionContext,
  GraphQLModule,
  Mutation,
  Query,
  ResolveField,
  Resolver,
  Subscription,
} from '@nestjs/graphql';
import { Test } from '@nestjs/testing';
import { ConfigModule } from '@nestjs/config';
import { RateLimit, RateLimitConfigurationError, RateLimitModule } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { describeStores, sharedRedis } from '../support/matrix.js';
import { scriptCalls } from '../support/shared-redis.js';
import { LogCapture } from '../support/log-capture.js';
import { uniquePrefix } from '../support/test-app.js';

/** The user a GraphQL request names in its `x-user` header, from the request behind the operation. */
function userOf(context: ExecutionContext): string {
  return GqlExecutionContext.create(context).getContext<{ req: { headers: Record<string, string> } }>().req.headers[
    'x-user'
  ];
}

@Resolver()
class GreetingsResolver {
  /** 2 a minute per client address. */
  @Query(() => String)
  @RateLimit({ count: 2, window: '1m' })
  hello() {
    return 'hello';
  }

  /** 1 a minute per user. */
  @Mutation(() => Boolean)
  @RateLimit({ count: 1, window: '1m', by: userOf })
  greet(@Args('name', { type: () => String }) _name: string) {
    return true;
  }

  @Query(() => String)
  free() {
    return 'free';
  }
}

interface AuthenticatedRequest {
  headers: Record<string, string | undefined>;
  user?: { id: string };
}

const requestOf = (context: ExecutionContext) =>
  GqlExecutionContext.create(context).getContext<{ req: AuthenticatedRequest }>().req;

/** An auth guard for resolvers: `Authorization: Bearer <user>` sets `req.user`, else it refuses. */
@Injectable()
class GqlAuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = requestOf(context);
    const [scheme, user] = req.headers.authorization?.split(' ') ?? [];
    if (scheme !== 'Bearer' || !user) throw new UnauthorizedException();
    req.user = { id: user };
    return true;
  }
}

@Resolver()
@UseGuards(GqlAuthGuard)
class AccountResolver {
  /** 1 a minute per signed-in user. */
  @Query(() => String)
  @RateLimit({ count: 1, window: '1m', by: (context) => requestOf(context).user?.id })
  balance() {
    return '42';
  }
}

async function createGraphQLApp(
  resolvers: unknown[],
  redis: string | undefined,
  logger: LogCapture | false = false,
): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
      RateLimitModule.forRoot({ redis, keyPrefix: uniquePrefix() }),
      GraphQLModule.forRoot<ApolloDriverConfig>({
        driver: ApolloDriver,
        autoSchemaFile: true,
        allowBatchedHttpRequests: true,
      }),
    ],
    providers: resolvers as never[],
  }).compile();
  const app = moduleRef.createNestApplication({ logger, abortOnError: false });
  await app.init();
  return app;
}

describeStores('@RateLimit on GraphQL resolvers (Apollo)', (store) => {
  let app: INestApplication | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  const operation = (query: string, user = 'ada') =>
    request(app!.getHttpServer()).post('/graphql').set('x-user', user).send({ query });

  it('answers queries up to the limit, then a GraphQL error with its code and the retry time', async () => {
    const logs = new LogCapture();
    app = await createGraphQLApp([GreetingsResolver], await store.redis(), logs);
    for (let i = 0; i < 2; i += 1) expect((await operation('{ hello }')).body).toEqual({ data: { hello: 'hello' } });
    const rejected = await operation('{ hello }');
    // A GraphQL answer, not a 429: the error says why and when to retry.
    expect(rejected.status).toBe(200);
    expect(rejected.body.data).toBeNull();
    expect(rejected.body.errors).toHaveLength(1);
    const [error] = rejected.body.errors as { message: string; extensions: Record<string, unknown> }[];
    expect(error.message).toBe("Too many requests (rate limit 'GreetingsResolver.hello'); retry in 60 s");
    expect(error.extensions).toMatchObject({ code: 'RATE_LIMITED', retryAfter: 60, rule: 'GreetingsResolver.hello' });
    expect(rejected.headers['retry-after']).toBe('60');
    // Another field of the same operation document is limited on its own.
    expect((await operation('{ free }')).body).toEqual({ data: { free: 'free' } });
    // A rejection is an answer: Nest logs no error for it (the limiter samples its own lines).
    expect(logs.at('error')).toEqual([]);
  });

  /** One document asking `hello` under `n` aliases. */
  const aliases = (n: number) => `{ ${Array.from({ length: n }, (_, i) => `a${i}: hello`).join(' ')} }`;

  it('answers one request of 5,000 aliases with bounded store calls and log lines, and no error logged', async () => {
    const logs = new LogCapture();
    const redis = await store.redis();
    app = await createGraphQLApp([GreetingsResolver], redis, logs);
    const client = redis ? (await sharedRedis()).client() : undefined;
    await client?.config('RESETSTAT');
    const answered = await operation(aliases(5_000));
    expect(answered.status).toBe(200);
    // A failed non-null field ends the operation: GraphQL answers null data with the refusal.
    expect(answered.body.data).toBeNull();
    expect(answered.body.errors.length).toBeGreaterThanOrEqual(1);
    expect(answered.body.errors[0].extensions.code).toBe('RATE_LIMITED');
    // Within the minute the first field started (a busy machine takes a while over 5,000 fields).
    expect(Number(answered.headers['retry-after'])).toBeGreaterThanOrEqual(55);
    expect(Number(answered.headers['retry-after'])).toBeLessThanOrEqual(60);
    // Fields still running after the answer went out finish without touching it.
    await app.close();
    app = undefined;
    expect(logs.at('error')).toEqual([]);
    expect(logs.lines.length).toBeLessThan(20);
    if (client) {
      // Two admissions, the refusal that tells the limit is reached (and a script load at most):
      // the block cache refuses the rest.
      expect(await scriptCalls(client)).toBeLessThanOrEqual(4);
    }
  });

  it('counts every operation of a batch, with bounded log lines', async () => {
    const logs = new LogCapture();
    app = await createGraphQLApp([GreetingsResolver], await store.redis(), logs);
    const batch = Array.from({ length: 200 }, () => ({ query: aliases(20) }));
    const answered = await request(app.getHttpServer()).post('/graphql').set('x-user', 'ada').send(batch);
    expect(answered.status).toBe(200);
    const results = answered.body as { data: unknown; errors?: { extensions: { code: string } }[] }[];
    expect(results).toHaveLength(200);
    // The first operation's first two fields were admitted (the limit is 2 a minute): every other
    // operation of the batch is refused.
    const refused = results.filter((result) => result.errors?.[0].extensions.code === 'RATE_LIMITED');
    expect(refused.length).toBeGreaterThanOrEqual(199);
    await app.close();
    app = undefined;
    expect(logs.at('error')).toEqual([]);
    expect(logs.lines.length).toBeLessThan(20);
  });

  it('counts per user behind an auth guard on the resolver, which answers requests without credentials', async () => {
    app = await createGraphQLApp([AccountResolver], await store.redis());
    const balance = (user?: string) => {
      const req = request(app!.getHttpServer()).post('/graphql');
      return (user ? req.set('authorization', `Bearer ${user}`) : req).send({ query: '{ balance }' });
    };
    expect((await balance('alice')).body).toEqual({ data: { balance: '42' } });
    expect((await balance('alice')).body.errors[0].extensions.code).toBe('RATE_LIMITED');
    expect((await balance('bob')).body).toEqual({ data: { balance: '42' } });
    for (let i = 0; i < 3; i += 1) {
      const anonymous = await balance();
      expect(anonymous.body.errors[0].message).toBe('Unauthorized');
      expect(anonymous.body.errors[0].extensions.code).not.toBe('RATE_LIMITED');
    }
  });

  it('counts by an identity from the request behind the operation', async () => {
    app = await createGraphQLApp([GreetingsResolver], await store.redis());
    const greet = 'mutation { greet(name: "x") }';
    expect((await operation(greet, 'ada')).body).toEqual({ data: { greet: true } });
    expect((await operation(greet, 'ada')).body.errors[0].extensions.code).toBe('RATE_LIMITED');
    expect((await operation(greet, 'grace')).body).toEqual({ data: { greet: true } });
  });
});

it('refuses @RateLimit on a subscription or a field resolver at bootstrap, naming the handler', async () => {
  @Resolver()
  class LiveResolver {
    @Query(() => String)
    now() {
      return 'now';
    }

    @Subscription(() => String)
    @RateLimit(5, '1s')
    ticks() {
      return null;
    }
  }
  await expect(createGraphQLApp([LiveResolver], undefined)).rejects.toThrow(
    /^@RateLimit on LiveResolver.ticks: LiveResolver.ticks is a GraphQL subscription \(its events are not requests the guard sees\)/,
  );

  @Resolver(() => String)
  class FieldResolver {
    @Query(() => String)
    name() {
      return 'x';
    }

    @ResolveField(() => String)
    @RateLimit(5, '1s')
    length() {
      return '1';
    }
  }
  await expect(createGraphQLApp([FieldResolver], undefined)).rejects.toBeInstanceOf(RateLimitConfigurationError);
});

import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import type { ExecutionContext, INestApplication } from '@nestjs/common';
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
import { describeStores } from '../support/matrix.js';
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

async function createGraphQLApp(
  resolvers: unknown[],
  redis: string | undefined,
  logger: LogCapture | false = false,
): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
      RateLimitModule.forRoot({ redis, keyPrefix: uniquePrefix() }),
      GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
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

import { request as httpRequest } from 'node:http';
import type { ExecutionContext } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { Args, GqlExecutionContext, GraphQLModule, Mutation, Query, Resolver, Subscription } from '@nestjs/graphql';
import { MercuriusDriver, type MercuriusDriverConfig } from '@nestjs/mercurius';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitModule } from 'nest-rate-limit';
import { afterEach, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStores, sharedRedis } from '../support/matrix.js';
import { scriptCalls } from '../support/shared-redis.js';
import { uniquePrefix } from '../support/test-app.js';

/**
 * GraphQL on Fastify through Mercurius (`@nestjs/mercurius`), asked over real HTTP from distinct
 * loopback addresses: the guard finds the Fastify request behind an operation in the context
 * (`req`, which Nest's driver sets), sets `Retry-After` on its reply, and the refusal is a GraphQL
 * error with its extensions, as on Apollo (`graphql.e2e.spec.ts`).
 */

/** The user a request names in its `x-user` header: Nest's Mercurius driver puts the Fastify request at `req`. */
function userOf(context: ExecutionContext): string | undefined {
  return GqlExecutionContext.create(context).getContext<{ req: { headers: Record<string, string | undefined> } }>().req
    .headers['x-user'];
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

async function createMercuriusApp(
  resolvers: unknown[],
  redis: string | undefined,
  logger: LogCapture | false = false,
): Promise<NestFastifyApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
      RateLimitModule.forRoot({ redis, keyPrefix: uniquePrefix() }),
      GraphQLModule.forRoot<MercuriusDriverConfig>({
        driver: MercuriusDriver,
        autoSchemaFile: true,
        allowBatchedQueries: true,
      }),
    ],
    providers: resolvers as never[],
  }).compile();
  const app = moduleRef.createNestApplication<NestFastifyApplication>(new FastifyAdapter(), {
    logger,
    abortOnError: false,
  });
  await app.listen(0, '127.0.0.1');
  return app;
}

interface GraphQLAnswer {
  status: number;
  retryAfter: string | undefined;
  body: {
    data: Record<string, unknown> | null;
    errors?: { message: string; extensions?: Record<string, unknown> }[];
  };
}

/**
 * Posts one GraphQL document to the app over HTTP, from the loopback address `from` (every
 * address of 127.0.0.0/8 is this machine's), so clients differ by address as they would in front
 * of a real server.
 */
function post(
  app: NestFastifyApplication,
  query: string | { query: string }[],
  { from = '127.0.0.1', user = 'ada' }: { from?: string; user?: string } = {},
): Promise<GraphQLAnswer> {
  const { port } = app.getHttpServer().address() as { port: number };
  const payload = JSON.stringify(typeof query === 'string' ? { query } : query);
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        host: '127.0.0.1',
        port,
        path: '/graphql',
        method: 'POST',
        localAddress: from,
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), 'x-user': user },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => {
          const retryAfter = res.headers['retry-after'];
          resolve({ status: res.statusCode!, retryAfter, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

/** One document asking `hello` under `n` aliases. */
const aliases = (n: number) => `{ ${Array.from({ length: n }, (_, i) => `a${i}: hello`).join(' ')} }`;

describeStores('@RateLimit on GraphQL resolvers (Mercurius on Fastify)', (store) => {
  let app: NestFastifyApplication | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('answers queries up to the limit, then a GraphQL error with its code and the retry time', async () => {
    const logs = new LogCapture();
    app = await createMercuriusApp([GreetingsResolver], await store.redis(), logs);
    for (let i = 0; i < 2; i += 1) expect((await post(app, '{ hello }')).body).toEqual({ data: { hello: 'hello' } });
    const rejected = await post(app, '{ hello }');
    expect(rejected.status).toBe(200);
    expect(rejected.body.data).toBeNull();
    expect(rejected.body.errors).toHaveLength(1);
    const [error] = rejected.body.errors!;
    expect(error.message).toBe("Too many requests (rate limit 'GreetingsResolver.hello'); retry in 60 s");
    expect(error.extensions).toEqual({ code: 'RATE_LIMITED', retryAfter: 60, rule: 'GreetingsResolver.hello' });
    expect(rejected.retryAfter).toBe('60');
    // Another field is limited on its own.
    expect((await post(app, '{ free }')).body).toEqual({ data: { free: 'free' } });
    expect(logs.at('error')).toEqual([]);
  });

  it('counts by client address: another address is not limited by the first one', async () => {
    app = await createMercuriusApp([GreetingsResolver], await store.redis());
    // Different users, one address: `by: 'ip'` counts the address, not the header.
    expect((await post(app, '{ hello }', { user: 'ada' })).body.data).toEqual({ hello: 'hello' });
    expect((await post(app, '{ hello }', { user: 'grace' })).body.data).toEqual({ hello: 'hello' });
    expect((await post(app, '{ hello }', { user: 'alan' })).body.errors?.[0].extensions?.code).toBe('RATE_LIMITED');
    expect((await post(app, '{ hello }', { from: '127.0.0.2' })).body).toEqual({ data: { hello: 'hello' } });
    expect((await post(app, '{ hello }', { from: '127.0.0.2' })).body).toEqual({ data: { hello: 'hello' } });
    expect((await post(app, '{ hello }', { from: '127.0.0.2' })).body.errors?.[0].extensions?.code).toBe(
      'RATE_LIMITED',
    );
  });

  it('counts by an identity from the request behind the operation', async () => {
    app = await createMercuriusApp([GreetingsResolver], await store.redis());
    const greet = 'mutation { greet(name: "x") }';
    expect((await post(app, greet, { user: 'ada' })).body).toEqual({ data: { greet: true } });
    const refused = await post(app, greet, { user: 'ada' });
    expect(refused.body.errors?.[0].extensions).toEqual({
      code: 'RATE_LIMITED',
      retryAfter: 60,
      rule: 'GreetingsResolver.greet',
    });
    // Same address, another user.
    expect((await post(app, greet, { user: 'grace' })).body).toEqual({ data: { greet: true } });
  });

  it('counts each alias of a document, with bounded store calls and log lines, and no error logged', async () => {
    const logs = new LogCapture();
    const redis = await store.redis();
    app = await createMercuriusApp([GreetingsResolver], redis, logs);
    const client = redis ? (await sharedRedis()).client() : undefined;
    await client?.config('RESETSTAT');
    // Three aliases with a limit of 2: the third is refused, the document does not count once.
    const three = await post(app, aliases(3));
    expect(three.body.data).toBeNull();
    expect(three.body.errors?.map((error) => error.extensions?.code)).toEqual(['RATE_LIMITED']);
    expect(three.retryAfter).toBe('60');
    const many = await post(app, aliases(2_000));
    expect(many.status).toBe(200);
    expect(many.body.data).toBeNull();
    expect(many.body.errors?.[0].extensions?.code).toBe('RATE_LIMITED');
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
    app = await createMercuriusApp([GreetingsResolver], await store.redis(), logs);
    const batch = await post(
      app,
      Array.from({ length: 200 }, () => ({ query: aliases(20) })),
    );
    expect(batch.status).toBe(200);
    const results = batch.body as unknown as GraphQLAnswer['body'][];
    expect(results).toHaveLength(200);
    // The first operation's first two fields were admitted (2 a minute): every operation is refused.
    const refused = results.filter((result) => result.errors?.[0].extensions?.code === 'RATE_LIMITED');
    expect(refused.length).toBeGreaterThanOrEqual(199);
    await app.close();
    app = undefined;
    expect(logs.at('error')).toEqual([]);
    expect(logs.lines.length).toBeLessThan(20);
  });
});

it('refuses @RateLimit on a Mercurius subscription at bootstrap, naming the handler', async () => {
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
  await expect(createMercuriusApp([LiveResolver], undefined)).rejects.toThrow(
    /^@RateLimit on LiveResolver.ticks: LiveResolver.ticks is a GraphQL subscription/,
  );
});

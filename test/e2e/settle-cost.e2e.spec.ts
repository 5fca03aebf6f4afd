import { Body, Controller, type ExecutionContext, type INestApplication, Post } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Args, GraphQLModule, Int, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitModule, RateLimiterService } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { describeStores, describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

interface CompletionRequest {
  tenant: string;
  /** What the client asks for at most: the reservation. */
  maxTokens: number;
  /** What the "model" uses: the real cost. */
  uses: number;
}
interface Completion {
  usage: { totalTokens: number };
}

const body = (context: ExecutionContext) => context.switchToHttp().getRequest<{ body: CompletionRequest }>().body;

/** Holds handlers until released: so concurrent requests are all decided before any settles. */
class Gate {
  private opened = opening();
  waiting = 0;
  private arrived: (() => void) | undefined;

  async pass(): Promise<void> {
    this.waiting += 1;
    this.arrived?.();
    await this.opened.promise;
  }

  /** Resolves once `count` handlers wait. */
  async until(count: number): Promise<void> {
    while (this.waiting < count) await new Promise<void>((resolve) => (this.arrived = resolve));
  }

  open(): void {
    this.opened.resolve();
  }

  reset(): void {
    this.opened = opening();
    this.waiting = 0;
  }
}

function opening(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((done) => (resolve = done));
  return { promise, resolve };
}
const gate = new Gate();
let gated = false;

@Controller()
class CompletionsController {
  /** A token budget per tenant per minute: `maxTokens` reserved, the tokens used charged after. */
  @Post('completions')
  @RateLimit({
    count: 1_000,
    window: '1m',
    by: (context) => body(context).tenant,
    cost: (context) => body(context).maxTokens,
    settleCost: (result) => (result as Completion).usage.totalTokens,
  })
  async complete(@Body() given: CompletionRequest): Promise<Completion> {
    if (gated) await gate.pass();
    return { usage: { totalTokens: given.uses } };
  }
}

describeStoresAndPlatforms('settleCost: the real cost settled after the handler', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    gated = false;
    gate.reset();
    await app?.close();
    app = undefined;
  });

  async function start(): Promise<INestApplication> {
    app = await createTestApp({
      platform,
      controllers: [CompletionsController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    return app;
  }

  const used = (tenant: string) => app!.get(RateLimiterService).inspect('CompletionsController.complete', tenant);
  /** The settlement runs once the answer is out: the inspection waits for it. */
  const settledAt = async (tenant: string, units: number) => {
    for (let i = 0; i < 100 && (await used(tenant)).used !== units; i += 1) await new Promise((r) => setImmediate(r));
    return (await used(tenant)).used;
  };

  it('refunds what a request reserved and did not use; charges an overdraft, so the next requests wait', async () => {
    await start();
    const post = (maxTokens: number, uses: number) =>
      request(app!.getHttpServer()).post('/completions').send({ tenant: 'acme', maxTokens, uses });
    const first = await post(500, 100);
    expect([first.status, first.headers['ratelimit-remaining']]).toEqual([201, '500']);
    expect(await settledAt('acme', 100)).toBe(100);
    // An overdraft: 100 reserved, 800 used.
    await post(100, 800).expect(201);
    expect(await settledAt('acme', 900)).toBe(900);
    // 900 of 1,000 used: a request reserving 200 waits for the window.
    const refused = await post(200, 10);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
    await post(100, 100).expect(201);
    expect(await settledAt('acme', 1_000)).toBe(1_000);
  });

  /** 50 requests at once, each reserving 50 and using `uses[i]`; all decided before any settles. */
  async function wave(tenant: string, uses: readonly number[]): Promise<number[]> {
    gated = true;
    let refused = 0;
    // Sent at once (supertest sends when asked for its answer).
    const answers = uses.map((n) =>
      request(app!.getHttpServer())
        .post('/completions')
        .send({ tenant, maxTokens: 50, uses: n })
        .then(({ status }) => {
          if (status === 429) refused += 1;
          return status;
        }),
    );
    // Reservations of 50 each: 20 fit in 1,000 while all are in flight; every request decided
    // (waiting at the gate, or refused) before any settles.
    await gate.until(20);
    while (gate.waiting + refused < uses.length) await new Promise((resolve) => setImmediate(resolve));
    gate.open();
    const statuses = await Promise.all(answers);
    gated = false;
    gate.reset();
    return statuses;
  }

  it('under 50 concurrent requests: the stored count is the sum of the real costs, refunds and overdrafts alike', async () => {
    await start();
    // 5 use 80 (an overdraft of 30 each), the others 0 to 39: whichever 20 are admitted use under 1,000.
    const uses = Array.from({ length: 50 }, (_, i) => (i < 5 ? 80 : (i * 7) % 40));
    const statuses = await wave('globex', uses);
    expect(statuses.filter((status) => status === 201)).toHaveLength(20);
    expect(statuses.filter((status) => status === 429)).toHaveLength(30);
    const total = uses.filter((_, i) => statuses[i] === 201).reduce((sum, n) => sum + n, 0);
    expect(await settledAt('globex', total)).toBe(total);
  });

  it('under 50 concurrent requests past the budget: admitted by their reservations only, then nothing more', async () => {
    await start();
    // Each admitted request overdraws (50 reserved, 51 to 100 used): the budget ends in the wave.
    const uses = Array.from({ length: 50 }, (_, i) => 51 + ((i * 37) % 50));
    const statuses = await wave('initech', uses);
    expect(statuses.filter((status) => status === 201)).toHaveLength(20);
    // Every overdraft charged: the budget is gone (1,000 reserved, more used), and the next request waits.
    expect(await settledAt('initech', 1_000)).toBe(1_000);
    const next = await request(app!.getHttpServer())
      .post('/completions')
      .send({ tenant: 'initech', maxTokens: 1, uses: 1 });
    expect(next.status).toBe(429);
  });
});

@Resolver()
class SearchResolver {
  @Query(() => String)
  ping() {
    return 'pong';
  }

  /** 100 rows a minute per client: 20 reserved, the rows returned charged. */
  @Query(() => [String])
  @RateLimit({
    count: 100,
    window: '1m',
    cost: 20,
    settleCost: (result) => (result as string[]).length,
  })
  search(@Args('rows', { type: () => Int }) rows: number): string[] {
    return Array.from({ length: rows }, (_, i) => `row ${i}`);
  }
}

describeStores('settleCost on a GraphQL operation', (store) => {
  it('charges what the resolver returned', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
        RateLimitModule.forRoot({ redis: await store.redis(), keyPrefix: uniquePrefix() }),
      ],
      providers: [SearchResolver],
    }).compile();
    const graphql = moduleRef.createNestApplication({ logger: false });
    await graphql.init();
    try {
      const search = (rows: number) =>
        request(graphql.getHttpServer())
          .post('/graphql')
          .send({ query: `{ search(rows: ${rows}) }` });
      expect((await search(5)).body.data.search).toHaveLength(5);
      expect((await search(60)).body.data.search).toHaveLength(60);
      const limiter = graphql.get(RateLimiterService);
      const used = async () => (await limiter.inspect('SearchResolver.search', '::ffff:127.0.0.1')).used;
      for (let i = 0; i < 100 && (await used()) !== 65; i += 1) await new Promise((r) => setImmediate(r));
      expect(await used()).toBe(65);
      // 35 left: a search reserving 20 passes, the next is refused once it charged 30.
      expect((await search(30)).body.data.search).toHaveLength(30);
      for (let i = 0; i < 100 && (await used()) !== 95; i += 1) await new Promise((r) => setImmediate(r));
      expect((await search(1)).body.errors[0].extensions.code).toBe('RATE_LIMITED');
    } finally {
      await graphql.close();
    }
  });
});

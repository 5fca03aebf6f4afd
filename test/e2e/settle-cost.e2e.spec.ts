import {
  Body,
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  Post,
  UseGuards,
} from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Args, GraphQLModule, Int, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { RateLimit, RateLimitInterceptor, RateLimitModule, RateLimiterService } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { describeStores, describeStoresAndPlatforms } from '../support/matrix.js';
import { usedOnceSettled } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

interface CompletionRequest {
  tenant: string;
  /** What the client expects to use: the reservation. */
  estimate: number;
  /** What the "model" uses: the real cost (at most MAX_TOKENS, unless a test says otherwise). */
  uses: number;
  /** The handler fails after the decision. */
  fail?: boolean;
}
/** The route's `settleCost.max`: the most tokens a completion can use. */
const MAX_TOKENS = 100;
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
  /** A token budget per tenant per minute: the estimate reserved, the tokens used charged after. */
  @Post('completions')
  @RateLimit({
    count: 1_000,
    window: '1m',
    by: (context) => body(context).tenant,
    cost: (context) => body(context).estimate,
    settleCost: { actual: (result) => (result as Completion).usage.totalTokens, max: MAX_TOKENS },
  })
  async complete(@Body() given: CompletionRequest): Promise<Completion> {
    if (gated) await gate.pass();
    if (given.fail) throw new Error('model unavailable');
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

  const settledAt = (tenant: string, units: number) =>
    usedOnceSettled(app!.get(RateLimiterService), 'CompletionsController.complete', tenant, units);

  const post = (tenant: string, estimate: number, uses: number, fail = false) =>
    request(app!.getHttpServer()).post('/completions').send({ tenant, estimate, uses, fail });

  it('refunds what a request reserved and did not use; charges an overdraft, so the next requests wait', async () => {
    await start();
    const first = await post('acme', 50, 10);
    expect([first.status, first.headers['ratelimit-remaining']]).toEqual([201, '950']);
    expect(await settledAt('acme', 10)).toBe(10);
    // An overdraft: 20 reserved, 90 used.
    await post('acme', 20, 90).expect(201);
    expect(await settledAt('acme', 100)).toBe(100);
    for (let used = 100; used < 900; used += 100) {
      await post('acme', 50, 100).expect(201);
      expect(await settledAt('acme', used + 100)).toBe(used + 100);
    }
    // Alone, a request is admitted by its estimate: 900 + 60 fits, and it uses 100.
    await post('acme', 60, 100).expect(201);
    expect(await settledAt('acme', 1_000)).toBe(1_000);
    const refused = await post('acme', 1, 1);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
  });

  it('a request whose handler fails keeps its reservation, and holds nothing more in flight', async () => {
    await start();
    expect((await post('umbrella', 50, 0, true)).status).toBe(500);
    expect(await settledAt('umbrella', 50)).toBe(50);
    // Its claim ended with it: the budget's last units are spent (with the claim held, the 19th
    // request would find 950 + 50 reserved and 50 at most in flight, past 1,000).
    for (let i = 0; i < 19; i += 1) {
      await post('umbrella', 50, 50).expect(201);
      expect(await settledAt('umbrella', 100 + i * 50)).toBe(100 + i * 50);
    }
    expect((await post('umbrella', 1, 1)).status).toBe(429);
  });

  /**
   * 50 requests at once, each reserving 50 and using `uses[i]`; all decided before any settles.
   * Admitted: while the budget holds each admitted one at its most (100); so `admitted` of them.
   */
  async function wave(tenant: string, uses: readonly number[], admitted: number): Promise<number[]> {
    gated = true;
    let refused = 0;
    // Sent at once (supertest sends when asked for its answer).
    const answers = uses.map((n) =>
      post(tenant, 50, n).then(({ status }) => {
        if (status === 429) refused += 1;
        return status;
      }),
    );
    await gate.until(admitted);
    while (gate.waiting + refused < uses.length) await new Promise((resolve) => setImmediate(resolve));
    gate.open();
    const statuses = await Promise.all(answers);
    gated = false;
    gate.reset();
    return statuses;
  }

  it('under 50 concurrent requests: the stored count is the sum of the real costs, refunds and overdrafts alike', async () => {
    await start();
    // Some overdraw (80 of 50 reserved), the others refund.
    const uses = Array.from({ length: 50 }, (_, i) => (i % 3 === 0 ? 80 : (i * 7) % 40));
    // In flight, each holds 50 reserved and 50 more at most: the 11th would find 1,000 held.
    const statuses = await wave('globex', uses, 10);
    expect(statuses.filter((status) => status === 201)).toHaveLength(10);
    expect(statuses.filter((status) => status === 429)).toHaveLength(40);
    const total = uses.filter((_, i) => statuses[i] === 201).reduce((sum, n) => sum + n, 0);
    expect(await settledAt('globex', total)).toBe(total);
  });

  it('under 50 concurrent requests near the end of the budget: past it by one overdraft at most', async () => {
    await start();
    for (let used = 0; used < 900; used += 100) await post('initech', 100, 100).expect(201);
    expect(await settledAt('initech', 900)).toBe(900);
    // 100 left: one request reserving 50 fits with its 50 more at most; a second would not.
    // (Admitted by their reservations alone, two would use 200: two overdrafts past the budget.)
    const statuses = await wave(
      'initech',
      Array.from({ length: 50 }, () => MAX_TOKENS),
      1,
    );
    expect(statuses.filter((status) => status === 201)).toHaveLength(1);
    expect(await settledAt('initech', 1_000)).toBe(1_000);
    expect((await post('initech', 1, 1)).status).toBe(429);
  });

  it('under 50 concurrent requests each using its most: the budget is never passed', async () => {
    await start();
    const statuses = await wave(
      'massive',
      Array.from({ length: 50 }, () => MAX_TOKENS),
      10,
    );
    const admitted = statuses.filter((status) => status === 201).length;
    expect(admitted).toBe(10);
    // At most the budget and one request's overdraft (50): here exactly the budget.
    expect(await settledAt('massive', admitted * MAX_TOKENS)).toBe(1_000);
  });
});

describeStoresAndPlatforms('settleCost: the headers describe the budget', (store, platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it("report the token budget, not a default's count of requests, until that count has nothing left", async () => {
    // A default of 3 requests a minute per address beside the budget of 1,000 tokens per tenant.
    app = await createTestApp({
      platform,
      controllers: [CompletionsController],
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        defaults: [{ name: 'per-address', count: 3, window: '1m' }],
      },
    });
    const post = () =>
      request(app!.getHttpServer()).post('/completions').send({ tenant: 'acme', estimate: 50, uses: 50 });
    const reported = (response: request.Response) =>
      ['ratelimit-limit', 'ratelimit-remaining'].map((name) => response.headers[name] as string | undefined);
    const first = await post().expect(201);
    expect(reported(first)).toEqual(['1000', '950']);
    const second = await post().expect(201);
    expect(reported(second)).toEqual(['1000', '900']);
    // The default's last request: the next one is refused by it, and the headers say so.
    const third = await post().expect(201);
    expect(reported(third)).toEqual(['3', '0']);
    const refused = await post().expect(429);
    expect(reported(refused)).toEqual(['3', '0']);
  });
});

@Controller()
class MixedController {
  @Get('plain')
  @RateLimit({ count: 100, window: '1m' })
  plain() {
    return 'plain';
  }

  @Get('settled')
  @RateLimit({ count: 100, window: '1m', cost: 2, settleCost: { actual: () => 1, max: 5 } })
  settled() {
    return 'settled';
  }
}

let closedForMaintenance = false;
class MaintenanceGuard implements CanActivate {
  canActivate(): boolean {
    return !closedForMaintenance;
  }
}

@Controller()
class GuardedController {
  /** A guard of the app's after the rate limit's: the rule is decided after it. */
  @Post('guarded')
  @UseGuards(MaintenanceGuard)
  @RateLimit({ count: 100, window: '1m', cost: 10, settleCost: { actual: () => 10, max: 60 } })
  guarded() {
    return 'done';
  }
}

describeStoresAndPlatforms('settleCost behind an app guard', (store, platform) => {
  it('a request the guard refuses holds no reservation and no claim: the budget stays whole', async () => {
    const app = await createTestApp({
      platform,
      controllers: [GuardedController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    try {
      closedForMaintenance = true;
      for (let i = 0; i < 5; i += 1) await request(app.getHttpServer()).post('/guarded').expect(403);
      closedForMaintenance = false;
      const statuses: number[] = [];
      for (let i = 0; i < 11; i += 1) statuses.push((await request(app.getHttpServer()).post('/guarded')).status);
      expect(statuses).toEqual([...Array.from({ length: 10 }, () => 201), 429]);
    } finally {
      closedForMaintenance = false;
      await app.close();
    }
  });
});

describe('the interceptor, only where a rule needs it', () => {
  it('runs around a settleCost route, never around a plain one or an app-wide default of fixed thresholds', async () => {
    const intercepted = vi.spyOn(RateLimitInterceptor.prototype, 'intercept');
    const app = await createTestApp({
      controllers: [MixedController],
      rateLimit: { defaults: [{ count: 1_000, window: '1m' }] },
    });
    try {
      for (let i = 0; i < 3; i += 1) await request(app.getHttpServer()).get('/plain').expect(200);
      expect(intercepted).not.toHaveBeenCalled();
      await request(app.getHttpServer()).get('/settled').expect(200);
      expect(intercepted).toHaveBeenCalledTimes(1);
    } finally {
      intercepted.mockRestore();
      await app.close();
    }
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
    settleCost: { actual: (result) => (result as string[]).length, max: 60 },
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
      const settledAt = (units: number) => usedOnceSettled(limiter, 'SearchResolver.search', '::ffff:127.0.0.1', units);
      expect(await settledAt(65)).toBe(65);
      // 35 left: a search reserving 20 passes, the next is refused once it charged 30.
      expect((await search(30)).body.data.search).toHaveLength(30);
      expect(await settledAt(95)).toBe(95);
      expect((await search(1)).body.errors[0].extensions.code).toBe('RATE_LIMITED');
    } finally {
      await graphql.close();
    }
  });
});

import { Body, Controller, type ExecutionContext, type INestApplication, Post } from '@nestjs/common';
import { RateLimit, RateLimiterService } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

interface CompletionRequest {
  tenant: string;
  /** The reservation. */
  estimate: number;
  /** The real cost. */
  uses: number;
  fail?: boolean;
}

const body = (context: ExecutionContext) => context.switchToHttp().getRequest<{ body: CompletionRequest }>().body;

/** Holds a handler until released: its settlement then comes after Redis is back. */
let held: { entered: () => void; release: Promise<void> } | undefined;

@Controller()
class CompletionsController {
  @Post('completions')
  @RateLimit({
    count: 1_000,
    window: '1m',
    by: (context) => body(context).tenant,
    cost: (context) => body(context).estimate,
    settleCost: { actual: (result) => (result as { usage: number }).usage, max: 100 },
  })
  async complete(@Body() given: CompletionRequest): Promise<{ usage: number }> {
    if (held) {
      const { entered, release } = held;
      entered();
      await release;
    }
    if (given.fail) throw new Error('model unavailable');
    return { usage: given.uses };
  }
}

const RULE = 'CompletionsController.complete';

describe('settleCost while Redis is out: the local fallback decides, and counts the real costs', () => {
  let server: RedisServer | undefined;
  let app: INestApplication | undefined;

  afterEach(async () => {
    held = undefined;
    await app?.close();
    await server?.stop();
    app = server = undefined;
  });

  async function start(): Promise<void> {
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [CompletionsController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix(), storeErrors: { policy: 'local', timeoutMs: 200 } },
    });
  }

  const post = (tenant: string, estimate: number, uses: number, fail = false) =>
    request(app!.getHttpServer()).post('/completions').send({ tenant, estimate, uses, fail });

  /** Redis killed: every call fails unsent, and the fallback records what it admits. */
  async function crash(): Promise<RedisServer> {
    const crashed = server!;
    await crashed.kill();
    return crashed;
  }

  /**
   * Redis back (empty, on the same port) and this app's connection with it. A request of another
   * tenant on Redis records what the fallback admitted (every key, one shard), before any request
   * of the tenant starts a window of its own there; a second one waits until that is recorded.
   */
  async function recover(crashed: RedisServer): Promise<void> {
    server = await startRedisServer([], crashed.port);
    await crashed.stop();
    const limiter = app!.get(RateLimiterService);
    await until(
      () =>
        limiter.inspect(RULE, 'bystander').then(
          () => true,
          () => false,
        ),
      { timeoutMs: 10_000, what: "the app's connection to the restarted Redis" },
    );
    await post('bystander', 1, 1).expect(201);
    await post('bystander', 1, 1).expect(201);
  }

  const used = (tenant: string) =>
    app!
      .get(RateLimiterService)
      .inspect(RULE, tenant)
      .then(({ used }) => used);

  it('after Redis returns, the stored count is the sum of the real costs: refunds, overdrafts, a failure', async () => {
    await start();
    const crashed = await crash();
    // Decided by the fallback (no rate-limit headers): 50 reserved, 10 used; 20 reserved, 90 used;
    // 40 and 40; 30 reserved and the handler failing (kept).
    for (const [estimate, uses] of [
      [50, 10],
      [20, 90],
      [40, 40],
    ]) {
      const answer = await post('acme', estimate, uses).expect(201);
      expect(answer.headers['ratelimit-remaining']).toBeUndefined();
    }
    await post('acme', 30, 0, true).expect(500);
    await recover(crashed);
    expect(await used('acme')).toBe(10 + 90 + 40 + 30);
  });

  it('an overdraft settled after Redis returned, of a request the fallback admitted, is counted', async () => {
    await start();
    const crashed = await crash();
    let entered!: () => void;
    const inHandler = new Promise<void>((resolve) => (entered = resolve));
    let release!: () => void;
    held = { entered, release: new Promise<void>((resolve) => (release = resolve)) };
    const answer = post('globex', 20, 95).then((response) => response.status);
    await inHandler;
    held = undefined;
    await recover(crashed);
    // Its reservation is recorded; its overdraft (75) once settled, at the next call after it.
    release();
    expect(await answer).toBe(201);
    await post('bystander', 1, 1).expect(201);
    await post('bystander', 1, 1).expect(201);
    expect(await used('globex')).toBe(95);
  });
});

import {
  Controller,
  Get,
  type INestApplication,
  Injectable,
  type MiddlewareConsumer,
  Module,
  type NestMiddleware,
  Req,
} from '@nestjs/common';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RateLimit, RateLimiterService } from 'nest-rate-limit';
import { describeStores } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Numbers requests as the app receives them, before any guard. */
let arrivals = 0;
@Injectable()
class ArrivalOrder implements NestMiddleware {
  use(request: { arrival?: number }, _response: unknown, next: () => void) {
    request.arrival = arrivals += 1;
    next();
  }
}

/** Each admitted request, in the order the handler ran it: its arrival number and when it ran. */
const admitted: { arrival: number; at: number }[] = [];

@Controller('wait')
class WaitController {
  /** 10 a second, and up to 12 s of waiting for room. */
  @Get('long')
  @RateLimit({ count: 10, window: '1s', algorithm: 'sliding-log', by: 'global', wait: { maxMs: '12s' } })
  long(@Req() request: { arrival: number }) {
    admitted.push({ arrival: request.arrival, at: performance.now() });
    return {};
  }

  /** The same, with 2 s of waiting at most. */
  @Get('short')
  @RateLimit({ count: 10, window: '1s', algorithm: 'sliding-log', by: 'global', wait: { maxMs: 2_000 } })
  short() {
    return {};
  }
}

/** Holds the capped handler until the test opens it; counts those inside. */
const capped = {
  inside: 0,
  most: 0,
  gate: Promise.resolve(),
  open: () => undefined as void,
  close() {
    this.gate = new Promise((resolve) => (this.open = resolve));
  },
};

@Controller('wait-cap')
class WaitCapController {
  /** Two at once; the others wait up to 5 s for a slot. */
  @Get()
  @RateLimit({ concurrency: 2, by: 'global', wait: { maxMs: '5s', maxQueued: 5 } })
  async run() {
    capped.inside += 1;
    capped.most = Math.max(capped.most, capped.inside);
    try {
      await capped.gate;
    } finally {
      capped.inside -= 1;
    }
    return {};
  }
}

@Module({ providers: [ArrivalOrder] })
class ArrivalModule {
  configure(consumer: MiddlewareConsumer) {
    consumer.apply(ArrivalOrder).forRoutes('*');
  }
}

interface Answer {
  status: number;
  /** How long the answer took, in ms. */
  ms: number;
  /** The time it waited for room, as its `Server-Timing` header says; undefined when it has none. */
  waitedMs: number | undefined;
}

/** `count` requests sent at once, and their answers. */
async function sendAtOnce(url: string, count: number): Promise<Answer[]> {
  return Promise.all(
    Array.from({ length: count }, async () => {
      const sent = performance.now();
      const response = await fetch(url);
      await response.arrayBuffer();
      const timing = /rate-limit-wait;dur=(\d+)/.exec(response.headers.get('server-timing') ?? '');
      return {
        status: response.status,
        ms: performance.now() - sent,
        waitedMs: timing ? Number(timing[1]) : undefined,
      };
    }),
  );
}

describeStores('waiting for room instead of a refusal (wait)', (store) => {
  let app: INestApplication;
  let base: string;

  beforeAll(async () => {
    app = await createTestApp({
      controllers: [WaitController, WaitCapController],
      imports: [ArrivalModule],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    await app.listen(0, '127.0.0.1');
    base = `http://127.0.0.1:${(app.getHttpServer().address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    await app?.close();
  });

  it('admits 100 sent at once at 10 a second within 12 s of waiting: none over the limit, in arrival order', async () => {
    admitted.length = 0;
    const answers = await sendAtOnce(`${base}/wait/long`, 100);
    expect(answers.map(({ status }) => status)).toEqual(Array(100).fill(200));
    // Never more than 10 in any second. The store decides on its own clock (Redis's TIME); the
    // handlers' clock sees each admission a few ms after it, and not always by the same few.
    const times = admitted.map(({ at }) => at).sort((a, b) => a - b);
    for (let i = 10; i < times.length; i += 1) expect(times[i] - times[i - 10]).toBeGreaterThanOrEqual(1_000 - 50);
    // In the order they arrived.
    const order = admitted.map(({ arrival }) => arrival);
    expect(order).toEqual([...order].sort((a, b) => a - b));
    // About 9 s: the tenth batch of ten, a second after the ninth.
    expect(Math.max(...answers.map(({ ms }) => ms))).toBeLessThan(12_000);
    // Those that waited say how long: the first ten did not; the last ten, about 9 s.
    const waited = answers.filter(({ waitedMs }) => waitedMs !== undefined);
    expect(waited.length).toBeGreaterThanOrEqual(80);
    for (const { waitedMs, ms } of waited) expect(waitedMs).toBeLessThanOrEqual(ms);
    expect(Math.max(...waited.map(({ waitedMs }) => waitedMs!))).toBeGreaterThanOrEqual(8_000);
  }, 30_000);

  it('with 2 s of waiting, refuses at once those whose turn would come later, and makes none wait past 2 s', async () => {
    const answers = await sendAtOnce(`${base}/wait/short`, 100);
    const refused = answers.filter(({ status }) => status === 429);
    expect(answers.filter(({ status }) => status === 200).length).toBeGreaterThanOrEqual(20);
    // Their turns would come at 3 s and later: told at once.
    expect(refused.filter(({ ms }) => ms < 500).length).toBeGreaterThanOrEqual(60);
    expect(Math.max(...answers.map(({ ms }) => ms))).toBeLessThan(2_500);
  }, 30_000);

  it('a cap: waiters take the slots as requests end, never more than the cap at once; past maxQueued, refused at once', async () => {
    capped.close();
    capped.most = 0;
    const answered: number[] = [];
    let wake: () => void = () => undefined;
    const sent = Array.from({ length: 9 }, () =>
      fetch(`${base}/wait-cap`).then((response) => {
        answered.push(response.status);
        wake();
        return response.status;
      }),
    );
    // 2 inside, 5 waiting (maxQueued), 2 refused at once.
    while (answered.length < 2) await new Promise<void>((resolve) => (wake = resolve));
    expect(answered).toEqual([429, 429]);
    expect(capped.inside).toBe(2);
    capped.open();
    expect((await Promise.all(sent)).sort()).toEqual([...Array(7).fill(200), 429, 429]);
    expect(capped.most).toBe(2);
  });

  it('outside HTTP: consume waits for room too, and the outcome says how long it waited', async () => {
    const limiter = app.get(RateLimiterService);
    const jobs = { name: 'waiting-jobs', count: 1, window: '300ms', wait: { maxMs: 1_000 } } as const;
    const first = await limiter.consume(jobs, 'tenant');
    const second = await limiter.consume(jobs, 'tenant');
    expect([first.allowed, second.allowed]).toEqual([true, true]);
    expect(first.waitedMs).toBeUndefined();
    expect(second.waitedMs).toBeGreaterThanOrEqual(200);
    expect(second.waitedMs).toBeLessThan(1_000);
  });

  it('a client gone while it waits leaves the queue at once, holds nothing, and never runs', async () => {
    capped.close();
    capped.most = 0;
    const holding = [0, 1].map(() => fetch(`${base}/wait-cap`).then((response) => response.status));
    const abort = new AbortController();
    const leaving = fetch(`${base}/wait-cap`, { signal: abort.signal }).catch(() => 'gone');
    const staying = fetch(`${base}/wait-cap`).then((response) => response.status);
    while (capped.inside < 2) await new Promise((resolve) => setImmediate(resolve));
    abort.abort();
    expect(await leaving).toBe('gone');
    capped.open();
    expect([...(await Promise.all(holding)), await staying]).toEqual([200, 200, 200]);
    expect(capped.most).toBe(2);
  });
});

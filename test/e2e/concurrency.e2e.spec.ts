import {
  type CallHandler,
  Controller,
  Get,
  type INestApplication,
  type NestInterceptor,
  Query,
  RequestTimeoutException,
  UseInterceptors,
} from '@nestjs/common';
import { TimeoutError, catchError, throwError, timeout } from 'rxjs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { ConfigService } from '@nestjs/config';
import request from 'supertest';
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { RateLimit, RateLimiterService } from 'nest-rate-limit';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { usedOnceSettled } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/**
 * What runs in the handlers at once, counted by the handlers themselves, and a gate that holds them
 * until the test opens it: no request ends before the test says so, and no sleep stands for one.
 */
class Running {
  now = 0;
  most = 0;
  private entered: (() => void)[] = [];
  private left: (() => void)[] = [];
  private gate!: Promise<void>;
  private open!: () => void;

  constructor() {
    this.close();
  }

  close(): void {
    this.gate = new Promise((resolve) => (this.open = resolve));
  }

  release(): void {
    this.open();
  }

  async run(fail = false): Promise<{ ok: true }> {
    this.now += 1;
    this.most = Math.max(this.most, this.now);
    this.entered.splice(0).forEach((wake) => wake());
    try {
      await this.gate;
      if (fail) throw new Error('handler failed');
      return { ok: true };
    } finally {
      this.now -= 1;
      this.left.splice(0).forEach((wake) => wake());
    }
  }

  /** Resolves once `count` requests are in the handlers. */
  async reached(count: number): Promise<void> {
    while (this.now < count) await new Promise<void>((resolve) => this.entered.push(resolve));
  }

  /** Resolves once no request is in the handlers. */
  async drained(): Promise<void> {
    while (this.now > 0) await new Promise<void>((resolve) => this.left.push(resolve));
  }
}

const running = new Running();

/**
 * Sends `count` requests at once and resolves once all but `held` have answered (those the cap
 * refused), the held ones still in the handlers; then opens the gate and resolves with them all.
 */
async function sendHolding(
  send: () => PromiseLike<request.Response>,
  count: number,
  held: number,
): Promise<request.Response[]> {
  let answered = 0;
  let wake: () => void = () => undefined;
  const all = Array.from({ length: count }, () =>
    Promise.resolve(send()).finally(() => {
      answered += 1;
      wake();
    }),
  );
  await running.reached(held);
  while (answered < count - held) await new Promise<void>((resolve) => (wake = resolve));
  expect(running.now).toBe(held);
  running.release();
  return Promise.all(all);
}

/** The usual timeout interceptor: past 100 ms the client gets a 408, while the handler runs on. */
class Timeout implements NestInterceptor {
  intercept(_context: unknown, next: CallHandler) {
    return next.handle().pipe(
      timeout(100),
      catchError((error: unknown) =>
        throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error)),
      ),
    );
  }
}

@Controller('cap')
class CapController {
  /** A cap of one behind a timeout interceptor. */
  @Get('timed')
  @RateLimit({ concurrency: 1, by: 'global' })
  @UseInterceptors(Timeout)
  timed() {
    return running.run();
  }

  @Get('work')
  @RateLimit({ concurrency: 3, by: 'global' })
  work(@Query('fail') fail?: string) {
    return running.run(fail !== undefined);
  }

  @Get('one')
  @RateLimit({ concurrency: 1, by: 'global' })
  one() {
    return running.run();
  }

  /** A cap whose value is live: `limits.cap.live.count` in the app's configuration. */
  @Get('live')
  @RateLimit({ concurrency: 3, by: 'global', configKey: 'cap.live' })
  live() {
    return running.run();
  }

  /** A cap and a rate on one handler, decided in one call. */
  @Get('both')
  @RateLimit({ concurrency: 2, by: 'global' })
  @RateLimit({ count: 4, window: '1h', by: 'global' })
  both() {
    return running.run();
  }
}

describeStoresAndPlatforms('concurrency caps', (store, platform) => {
  let app: INestApplication;
  let limiter: RateLimiterService;
  const used = (rule: string, units: number) => usedOnceSettled(limiter, rule, 'global', units);

  beforeAll(async () => {
    app = await createTestApp({
      platform,
      controllers: [CapController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    await app.listen(0, '127.0.0.1');
    limiter = app.get(RateLimiterService);
  });

  beforeEach(async () => {
    running.release();
    await running.drained();
    running.most = 0;
    running.close();
  });

  afterAll(async () => {
    running.release();
    await app?.close();
  });

  it('admits as many as the cap at once, refuses the rest with 429 naming the rule, and frees the slots when they end', async () => {
    const server = request(app.getHttpServer());
    const responses = await sendHolding(() => server.get('/cap/work'), 10, 3);
    const refused = responses.filter(({ status }) => status === 429);
    expect(responses.filter(({ status }) => status === 200)).toHaveLength(3);
    expect(refused).toHaveLength(7);
    expect(running.most).toBe(3);
    for (const response of refused) {
      expect(response.body.message).toContain("'CapController.work.concurrency'");
      // A slot comes back when some request ends: a second, not the slot's 30 s lease.
      expect(response.headers['retry-after']).toBe('1');
      expect(response.headers['ratelimit-reset']).toBe('1');
    }
    expect(await used('CapController.work.concurrency', 0)).toBe(0);
    const again = await Promise.all(Array.from({ length: 3 }, () => server.get('/cap/work')));
    expect(again.map(({ status }) => status)).toEqual([200, 200, 200]);
  });

  it('serves a client that sends each request as soon as it reads the last answer: its own slot is back by then', async () => {
    running.release();
    const server = request(app.getHttpServer());
    const statuses = [];
    for (let i = 0; i < 30; i += 1) statuses.push((await server.get('/cap/one')).status);
    expect(statuses).toEqual(Array(30).fill(200));
  });

  it('frees the slot of a request whose handler throws', async () => {
    running.release();
    const server = request(app.getHttpServer());
    for (let i = 0; i < 5; i += 1) await server.get('/cap/work').query({ fail: '' }).expect(500);
    expect(await used('CapController.work.concurrency', 0)).toBe(0);
  });

  it('frees the slot of a request a timeout interceptor answers with 408, though its handler runs on', async () => {
    const server = request(app.getHttpServer());
    await server.get('/cap/timed').expect(408);
    expect(running.now).toBe(1);
    expect(await used('CapController.timed.concurrency', 0)).toBe(0);
    // The next is admitted (and times out too), not refused by the first's slot.
    await server.get('/cap/timed').expect(408);
    expect(running.now).toBe(2);
  });

  it('keeps the slot of a client gone mid-request until its handler ends', async () => {
    const { port } = app.getHttpServer().address() as AddressInfo;
    const gone = Array.from({ length: 3 }, () => {
      const call = http.get({ host: '127.0.0.1', port, path: '/cap/work' });
      call.on('error', () => undefined);
      return call;
    });
    await running.reached(3);
    for (const call of gone) call.destroy();
    await Promise.all(gone.map((call) => new Promise((resolve) => call.on('close', resolve))));
    // The handlers still run: the cap holds for them.
    await request(app.getHttpServer()).get('/cap/work').expect(429);
    expect(running.most).toBe(3);
    running.release();
    await running.drained();
    expect(await used('CapController.work.concurrency', 0)).toBe(0);
    await request(app.getHttpServer()).get('/cap/work').expect(200);
  });

  it("takes the cap's slots live from its config key's count, and keeps its own when the key has a window", async () => {
    const config = app.get(ConfigService);
    const server = request(app.getHttpServer());
    config.set('limits.cap.live', { count: 1 });
    const one = await sendHolding(() => server.get('/cap/live'), 3, 1);
    expect(one.map(({ status }) => status).sort()).toEqual([200, 429, 429]);
    expect(await used('CapController.live.concurrency', 0)).toBe(0);
    // A window is no value of a cap's: refused, and the decorator's 3 stand.
    running.close();
    config.set('limits.cap.live', { window: '1s' });
    const three = await sendHolding(() => server.get('/cap/live'), 5, 3);
    expect(three.map(({ status }) => status).sort()).toEqual([200, 200, 200, 429, 429]);
    config.set('limits.cap.live', undefined);
  });

  it('decides a cap and a rate in one call: a request the cap refuses costs the rate nothing', async () => {
    const server = request(app.getHttpServer());
    const statuses = (await sendHolding(() => server.get('/cap/both'), 4, 2)).map(({ status }) => status).sort();
    expect(statuses).toEqual([200, 200, 429, 429]);
    expect(await used('CapController.both', 2)).toBe(2);
    expect(await used('CapController.both.concurrency', 0)).toBe(0);
    // Two more of the rate's four, then the rate refuses.
    await server.get('/cap/both').expect(200);
    await server.get('/cap/both').expect(200);
    const refused = await server.get('/cap/both').expect(429);
    expect(refused.body.message).toContain("'CapController.both'");
  });
});

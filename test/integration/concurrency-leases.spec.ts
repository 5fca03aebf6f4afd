import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest';
import { RateLimit, RateLimiterService } from 'nest-rate-limit';
import { describeStores } from '../support/matrix.js';
import { until } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Holds each request until the test opens the gate. */
let open: () => void = () => undefined;
let gate = Promise.resolve();
const closeGate = () => {
  gate = new Promise((resolve) => (open = resolve));
};

@Controller('lease')
class LeaseController {
  @Get()
  @RateLimit({ concurrency: 1, by: 'global' })
  async run() {
    await gate;
    return { ok: true };
  }
}

const LEASE_MS = 30_000;

/**
 * A request that runs longer than a slot's lease keeps its slot: the module's clock is a fake one,
 * and so is `setInterval`, which times the renewals; the store answers for real.
 */
describeStores('a concurrency slot held past its lease', (store) => {
  let app: INestApplication;
  let now = 1_800_000_000_000;
  const t0 = now;

  beforeAll(async () => {
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    app = await createTestApp({
      controllers: [LeaseController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), clock: () => now },
    });
    await app.listen(0, '127.0.0.1');
  });

  afterEach(() => open());

  afterAll(async () => {
    await app?.close();
    vi.useRealTimers();
  });

  const used = async () =>
    (await app.get(RateLimiterService).inspect('LeaseController.run.concurrency', 'global')).used;

  it('is renewed while its request runs, and given back when it ends', async () => {
    closeGate();
    const server = request(app.getHttpServer());
    const long = server.get('/lease').then((response) => response.status);
    await until(async () => (await used()) === 1, { timeoutMs: 2_000, what: 'the slot taken' });
    // Two renewals, a third of the lease apart, the last at t0 + 20 s.
    now = t0 + 10_000;
    await vi.advanceTimersByTimeAsync(LEASE_MS / 3);
    now = t0 + 20_000;
    await vi.advanceTimersByTimeAsync(LEASE_MS / 3);
    // Past the lease it was taken with: held all the same once the last renewal has landed.
    now = t0 + LEASE_MS + 5_000;
    await until(async () => (await used()) === 1, { timeoutMs: 2_000, what: 'the renewed slot held' });
    await server.get('/lease').expect(429);
    open();
    expect(await long).toBe(200);
    await until(async () => (await used()) === 0, { timeoutMs: 2_000, what: 'the slot given back' });
    await server.get('/lease').expect(200);
  });

  it('runs out without renewals, as a crashed instance leaves it', async () => {
    closeGate();
    now += 60_000;
    const server = request(app.getHttpServer());
    const long = server.get('/lease').then((response) => response.status);
    await until(async () => (await used()) === 1, { timeoutMs: 2_000, what: 'the slot taken' });
    // No tick: nothing renews it, and past its lease it is free again.
    now += LEASE_MS + 1;
    expect(await used()).toBe(0);
    open();
    expect(await long).toBe(200);
  });
});

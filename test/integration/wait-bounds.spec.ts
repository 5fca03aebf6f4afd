import type { INestApplication } from '@nestjs/common';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimiterService } from 'nest-rate-limit';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Requests that may wait at once in one instance, over every key. */
const MAX_WAITERS = 10_000;

/** One export at a time per tenant; the others wait for it. */
const EXPORTS = { name: 'bounded-exports', concurrency: 1, wait: { maxMs: '30s' } } as const;

describe('the memory waiting requests hold, in total', () => {
  let app: INestApplication;
  let limiter: RateLimiterService;

  beforeAll(async () => {
    // Room for every tenant's counter: the embedded store keeps 10,000 by default.
    app = await createTestApp({
      controllers: [],
      rateLimit: { keyPrefix: uniquePrefix(), memoryStore: { maxKeys: 20_000 } },
    });
    limiter = app.get(RateLimiterService);
  });

  afterAll(() => app?.close());

  it('is bounded: past 10,000 waiters in the instance, heads of their keys included, a request is refused at once', async () => {
    const tenants = Array.from({ length: MAX_WAITERS + 1 }, (_, i) => `tenant-${i}`);
    // Each tenant's one slot is taken: every request after it waits, alone at the head of its key.
    const holders = await Promise.all(tenants.map((tenant) => limiter.consume(EXPORTS, tenant)));
    expect(holders.every(({ allowed }) => allowed)).toBe(true);

    const waiting = tenants.map((tenant) => limiter.consume(EXPORTS, tenant));
    // Before any slot comes back, one of them is answered: the one past the bound, refused.
    const first = await Promise.race(waiting);
    expect(first.allowed).toBe(false);
    expect(first.waitedMs).toBeUndefined();

    // The slots come back: every one that waited is admitted.
    await Promise.all(holders.map((holder) => limiter.settle(holder, true)));
    const answers = await Promise.all(waiting);
    expect(answers.filter(({ allowed }) => allowed)).toHaveLength(MAX_WAITERS);
    expect(answers.filter(({ allowed }) => !allowed)).toEqual([first]);
  }, 30_000);
});

import { Body, Controller, Post, UseInterceptors } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { RateLimit, RateLimitInterceptor, RateLimiterService } from 'nest-rate-limit';
import request from 'supertest';
import { describe, expect, it, vi } from 'vitest';
import { usedOnceSettled } from '../support/poll.js';
import { createTestApp } from '../support/test-app.js';

interface Job {
  tenant: string;
  /** Reserved when the request is decided. */
  estimate: number;
  /** What the handler used: settled after it. */
  uses: number;
}

/**
 * A settleCost route the interceptor runs around more than once per call: app-wide (below), on the
 * class, and on the handler (`@RateLimit` adds it there for `settleCost`). Apps do this when they
 * list the interceptor themselves, not knowing the decorator already does.
 */
@Controller()
@UseInterceptors(RateLimitInterceptor)
class JobsController {
  @Post('jobs')
  @RateLimit({
    count: 1_000,
    window: '1m',
    by: (context) => context.switchToHttp().getRequest<{ body: Job }>().body.tenant,
    cost: (context) => context.switchToHttp().getRequest<{ body: Job }>().body.estimate,
    settleCost: { actual: (result) => (result as { used: number }).used, max: 100 },
  })
  run(@Body() job: Job) {
    return { used: job.uses };
  }
}

describe('RateLimitInterceptor applied more than once to one call', () => {
  it('settles the cost once: the stored count is the cost used, not charged or refunded twice', async () => {
    const intercepted = vi.spyOn(RateLimitInterceptor.prototype, 'intercept');
    const app = await createTestApp({
      controllers: [JobsController],
      providers: [{ provide: APP_INTERCEPTOR, useClass: RateLimitInterceptor }],
    });
    try {
      const limiter = app.get(RateLimiterService);
      // An overrun: 20 reserved, 50 used, so 30 are charged after the handler.
      await request(app.getHttpServer()).post('/jobs').send({ tenant: 'acme', estimate: 20, uses: 50 }).expect(201);
      expect(intercepted.mock.calls.length).toBeGreaterThanOrEqual(2);
      // Read until a second charge would show (80), for 100 turns of the event loop.
      expect(await usedOnceSettled(limiter, 'JobsController.run', 'acme', 80)).toBe(50);
      // Under the estimate: 40 reserved, 10 used, so 30 are refunded after it.
      await request(app.getHttpServer()).post('/jobs').send({ tenant: 'umbrella', estimate: 40, uses: 10 }).expect(201);
      // Refunded twice, 40 - 30 - 30 would leave nothing.
      expect(await usedOnceSettled(limiter, 'JobsController.run', 'umbrella', 0)).toBe(10);
    } finally {
      intercepted.mockRestore();
      await app.close();
    }
  });
});

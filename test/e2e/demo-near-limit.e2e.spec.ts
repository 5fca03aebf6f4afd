import type { INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { afterAll, expect, it } from 'vitest';
import { AppModule } from '../../apps/demo/src/app.module.js';
import { LogCapture } from '../support/log-capture.js';
import { uniquePrefix } from '../support/test-app.js';

/*
 * The demo's `onNearLimit` hook under a flood of tenants, each taken to 80% of its plan's limit on
 * GET /reports (5 a minute: the 4th request crosses): every crossing is its own event, and the demo
 * logs the first and sums the rest, so the log does not grow with the number of tenants.
 */

const savedEnv = { ...process.env };
afterAll(() => {
  process.env = savedEnv;
});

it('a flood of tenants near their limits writes a bounded number of lines, not one per tenant', async () => {
  process.env = { ...savedEnv, RATE_LIMIT_PREFIX: uniquePrefix() };
  delete process.env.REDIS_URL;
  const capture = new LogCapture();
  const moduleRef = await Test.createTestingModule({ imports: [AppModule] }).compile();
  const app: INestApplication = moduleRef.createNestApplication({ logger: capture });
  await app.init();
  try {
    const server = app.getHttpServer();
    // 280 requests from one address: under the default of 300 a minute per address and route.
    const tenants = 70;
    for (let tenant = 0; tenant < tenants; tenant += 1) {
      for (let i = 0; i < 4; i += 1) {
        await request(server).get('/reports').set('x-tenant', `t${tenant}`).expect(200);
      }
    }
    const lines = capture.at('log', /near the limit/);
    // The first crossing is logged at once, naming its tenant; within the interval the rest wait for
    // the sum (one line more at the most, if an interval ended during the flood).
    expect(lines[0]).toMatch(/^t0 is near the limit of PlansController\.reports: 1 left$/);
    expect(lines.length).toBeLessThanOrEqual(3);
  } finally {
    await app.close();
  }
});

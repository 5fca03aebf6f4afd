import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { RedisService } from 'nest-rate-limit/store';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Holds every request in the handler until the test opens the gate; counts those inside. */
const held = {
  inside: 0,
  open: () => undefined as void,
  gate: Promise.resolve(),
  close() {
    this.gate = new Promise((resolve) => (this.open = resolve));
  },
};

@Controller('outage')
class OutageController {
  @Get()
  @RateLimit({ concurrency: 4, by: 'global' })
  async run() {
    held.inside += 1;
    try {
      await held.gate;
    } finally {
      held.inside -= 1;
    }
    return {};
  }
}

describe("a concurrency cap while Redis is out: the policy 'local' caps each instance at its share", () => {
  let server: RedisServer;
  const apps: INestApplication[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    const prefix = uniquePrefix();
    for (let i = 0; i < 2; i += 1) {
      apps.push(
        await createTestApp({
          controllers: [OutageController],
          rateLimit: { redis: server.url, keyPrefix: prefix, storeErrors: { timeoutMs: 50, circuitBreaker: false } },
        }),
      );
    }
    for (const app of apps) {
      await until(() => app.get(RedisService).news.instances === 2, {
        timeoutMs: 5_000,
        what: 'both instances counted',
      });
    }
  });

  afterEach(() => {
    held.open();
    process.kill(server.pid, 'SIGCONT');
  });

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await server?.stop();
  });

  /** `count` requests to `app` at once: the statuses of those answered while the others are held. */
  async function sendHeld(app: INestApplication, count: number, inside: number) {
    const sent = Array.from({ length: count }, () => request(app.getHttpServer()).get('/outage').then());
    const refused = await Promise.race([
      Promise.all(sent),
      until(() => held.inside === inside, { timeoutMs: 5_000, what: `${inside} requests inside` }).then(() => []),
    ]);
    return { sent, refused };
  }

  it('admits half the slots on each of two instances, and gives the slots back when the requests end', async () => {
    process.kill(server.pid, 'SIGSTOP');
    // Until Redis seems down (a call unanswered past its deadline and a second more), it may be
    // slow, not down: the fallback then shares only the margin above the limit, none of 4 slots.
    for (const app of apps) {
      await request(app.getHttpServer()).get('/outage');
      await until(() => app.get(RedisService).runner.seemsDown, { timeoutMs: 5_000, what: 'Redis seeming down' });
    }
    held.close();
    const first = await sendHeld(apps[0], 3, 2);
    const second = await sendHeld(apps[1], 3, 4);
    expect(held.inside).toBe(4);
    held.open();
    const statuses = [...(await Promise.all(first.sent)), ...(await Promise.all(second.sent))].map((r) => r.status);
    expect(statuses.filter((status) => status === 200)).toHaveLength(4);
    expect(statuses.filter((status) => status === 429)).toHaveLength(2);
    // Given back on each instance: its share again, still without Redis.
    held.close();
    const again = await sendHeld(apps[0], 3, 2);
    held.open();
    expect((await Promise.all(again.sent)).map((r) => r.status).sort()).toEqual([200, 200, 429]);
  });
});

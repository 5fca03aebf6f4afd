import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitConfigurationError, RateLimiterService } from 'nest-rate-limit';
import { describeStores } from '../support/matrix.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

const byUser = (ctx: ExecutionContext) =>
  String(ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user']);

@Controller('reports')
class ReportsController {
  @Get()
  @RateLimit({ count: 3, window: '1m', name: 'reports', by: byUser })
  list() {
    return { ok: true };
  }

  @Get('login')
  @RateLimit({ count: 2, window: '1m', name: 'login', by: byUser, blockFor: '1h' })
  login() {
    return { ok: true };
  }
}

/** Two rules of one job queue, given as options: a minute's budget and a burst. */
const JOBS_PER_MINUTE = { name: 'jobs-minute', count: 5, window: '1m' } as const;
const JOBS_BURST = { name: 'jobs-burst', count: 2, window: '10s' } as const;

/** Deciding outside HTTP: queues, cron jobs, custom transports. */
describeStores('RateLimiterService.consume and reset', (store) => {
  let app: INestApplication;
  let limiter: RateLimiterService;
  let now = 1_800_000_000_000;

  beforeAll(async () => {
    app = await createTestApp({
      controllers: [ReportsController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), clock: () => now },
    });
    limiter = app.get(RateLimiterService);
  });

  afterAll(async () => {
    await app?.close();
  });

  const get = (path: string, user: string) => request(app.getHttpServer()).get(path).set('x-user', user);

  it('counts a rule declared on a route by its name, on the same counter the route uses', async () => {
    expect((await limiter.consume('reports', 'alice')).allowed).toBe(true);
    expect((await limiter.consume('reports', 'alice')).decisions[0].remaining).toBe(1);
    await get('/reports', 'alice').expect(200);
    await get('/reports', 'alice').expect(429);
    const refused = await limiter.consume('reports', 'alice');
    expect(refused.allowed).toBe(false);
    expect(refused.reported?.rule.name).toBe('reports');
    expect(refused.reported?.resetMs).toBeGreaterThan(0);
    // Another identity has its own counter.
    expect((await limiter.consume('reports', 'bob')).allowed).toBe(true);
  });

  it('decides several rules given as options at once: all admit and count, or none counts', async () => {
    const job = uniquePrefix();
    const rules = [JOBS_PER_MINUTE, JOBS_BURST];
    expect((await limiter.consume(rules, job)).allowed).toBe(true);
    expect((await limiter.consume(rules, job)).allowed).toBe(true);
    const refused = await limiter.consume(rules, job);
    expect(refused.allowed).toBe(false);
    expect(refused.reported?.rule.name).toBe('jobs-burst');
    // The refused job took nothing from the minute's budget: 5 - 2 = 3 left, then 2 after this one.
    expect((await limiter.consume(JOBS_PER_MINUTE, job)).decisions[0].remaining).toBe(2);
    now += 10_001;
    expect((await limiter.consume(rules, job, 2)).allowed).toBe(true);
    expect((await limiter.consume(JOBS_PER_MINUTE, job)).allowed).toBe(false);
  });

  it('reset lifts a lockout and a spent budget for one identity only', async () => {
    await sequential(3, () => get('/reports/login', 'carol'));
    await get('/reports/login', 'dave');
    await get('/reports/login', 'dave');
    await get('/reports/login', 'dave');
    now += 61_000;
    // The penalty (1 h) outlives the window.
    await get('/reports/login', 'carol').expect(429);
    await limiter.reset('login', 'carol');
    await get('/reports/login', 'carol').expect(200);
    await get('/reports/login', 'dave').expect(429);
  });

  it('caps work in flight: a slot held until settle, whatever the outcome', async () => {
    const scans = { name: 'scans', concurrency: 2 } as const;
    const first = await limiter.consume(scans, 'tenant');
    const second = await limiter.consume(scans, 'tenant');
    const third = await limiter.consume(scans, 'tenant');
    expect([first.allowed, second.allowed, third.allowed]).toEqual([true, true, false]);
    expect(third.reported).toMatchObject({ remaining: 0, resetMs: 1_000 });
    await limiter.settle(first, false);
    expect((await limiter.consume(scans, 'tenant')).allowed).toBe(true);
    expect((await limiter.consume(scans, 'other')).allowed).toBe(true);
  });

  it("settles an outcome once: settling it again gives back no other request's slot", async () => {
    const exports = { name: 'exports-twice', concurrency: 2 } as const;
    const first = await limiter.consume(exports, 'tenant');
    const second = await limiter.consume(exports, 'tenant');
    await limiter.settle(first, true);
    await limiter.settle(first, true);
    const third = await limiter.consume(exports, 'tenant');
    const fourth = await limiter.consume(exports, 'tenant');
    expect([second.allowed, third.allowed, fourth.allowed]).toEqual([true, true, false]);
  });

  it('names the problem when a rule cannot be used', async () => {
    await expect(limiter.consume('no-such-rule', 'x')).rejects.toThrow(
      /No @RateLimit rule is named "no-such-rule" \(rules: .*"reports"/,
    );
    await expect(limiter.consume({ name: 'bad', count: 0, window: '1m' }, 'x')).rejects.toThrow(
      /RateLimiterService.consume: rule "bad": 'count' must be a positive whole number, got 0/,
    );
    await expect(limiter.consume({ count: 1, window: '1m' } as never, 'x')).rejects.toThrow(/'name' must be/);
    await expect(limiter.consume(JOBS_BURST, '')).rejects.toThrow(/'identity' must be a non-empty string/);
    await expect(limiter.consume(JOBS_BURST, 'x', -1)).rejects.toThrow(RateLimitConfigurationError);
  });
});

describe('reset on a store shared by instances', () => {
  let redis: RedisServer;
  const apps: INestApplication[] = [];
  const prefix = uniquePrefix();
  const RULE = { name: 'shared', count: 20, window: '10m' } as const;

  beforeAll(async () => {
    redis = await startRedisServer();
    for (let i = 0; i < 2; i += 1) {
      apps.push(
        await createTestApp({
          controllers: [],
          // Both failover defences on (a lone server has neither by default): a reset must beat them.
          rateLimit: { redis: redis.url, keyPrefix: prefix, failover: { detectLostWrites: true, marker: 0.8 } },
        }),
      );
    }
  });

  afterAll(async () => {
    for (const app of apps) await app.close();
    await redis?.stop();
  });

  it("holds on every instance: another instance's memory of the window does not raise it back", async () => {
    const [a, b] = apps.map((app) => app.get(RateLimiterService));
    // 18 of 20: past the lost-write marker's 80 %, so the window's count is in the marker key too.
    for (let i = 0; i < 18; i += 1) await b.consume(RULE, 'eve');
    await a.reset(RULE, 'eve');
    // Neither the marker (the counter resumes from it when missing) nor B's memory of 18 in the old
    // window (its lost-write check) may bring the count back.
    const after = await b.consume(RULE, 'eve');
    expect(after.allowed).toBe(true);
    expect(after.decisions[0].remaining).toBe(19);
    expect((await a.consume(RULE, 'eve')).decisions[0].remaining).toBe(18);
  });
});

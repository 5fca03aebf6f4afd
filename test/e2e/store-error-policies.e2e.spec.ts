import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { RateLimit } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

const byUser = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

@Controller('policies')
class PoliciesController {
  @Get('local')
  @RateLimit({ count: 10, window: '1m', by: byUser })
  local() {
    return {};
  }

  @Get('allow')
  @RateLimit({ count: 1, window: '1m', by: byUser, onStoreError: 'allow' })
  allow() {
    return {};
  }

  @Get('deny')
  @RateLimit({ count: 100, window: '1m', by: byUser, onStoreError: 'deny' })
  deny() {
    return {};
  }
}

describe('when Redis cannot decide, each rule follows its onStoreError', () => {
  let server: RedisServer;
  let app: INestApplication;

  beforeAll(async () => {
    server = await startRedisServer();
    vi.useFakeTimers({ toFake: ['Date'] });
    app = await createTestApp({
      controllers: [PoliciesController],
      rateLimit: {
        redis: server.url,
        keyPrefix: uniquePrefix(),
        redisTimeoutMs: 50,
        circuitBreaker: false,
        clock: () => Date.now(),
        localFallback: { safetyFactor: 1.2, expectedInstances: 2 },
        storeErrorStatus: 503,
      },
    });
  });

  afterEach(() => process.kill(server.pid, 'SIGCONT'));

  afterAll(async () => {
    vi.useRealTimers();
    await app?.close();
    await server?.stop();
  });

  const get = (path: string, user: string) => request(app.getHttpServer()).get(path).set('x-user', user);

  async function statuses(path: string, user: string, n: number): Promise<number[]> {
    const result: number[] = [];
    for (let i = 0; i < n; i += 1) result.push((await get(path, user)).status);
    return result;
  }

  it("'local': admits from what Redis last said, pessimistically, and less as the window goes on", async () => {
    expect(await statuses('/policies/local', 'known', 6)).toEqual([200, 200, 200, 200, 200, 200]);
    process.kill(server.pid, 'SIGSTOP');
    // Others may have admitted since: (6 used + 0 elapsed) x 1.2 = 7.2 of 10, so 2 more here.
    expect(await statuses('/policies/local', 'known', 3)).toEqual([200, 200, 429]);
    // Half the window later: (6 + 0.5 x 10) x 1.2 = 13.2: nothing.
    vi.setSystemTime(Date.now() + 30_000);
    expect(await statuses('/policies/local', 'known', 1)).toEqual([429]);
  });

  it("'local': a key Redis never reported on gets count / expectedInstances, never unlimited", async () => {
    process.kill(server.pid, 'SIGSTOP');
    expect(await statuses('/policies/local', 'unknown', 6)).toEqual([200, 200, 200, 200, 200, 429]);
  });

  it("'allow' admits, 'deny' refuses with the configured 503 and Retry-After", async () => {
    process.kill(server.pid, 'SIGSTOP');
    expect(await statuses('/policies/allow', 'a', 3)).toEqual([200, 200, 200]);
    const denied = await get('/policies/deny', 'd').expect(503);
    expect(denied.headers['retry-after']).toBe('1');
    expect(denied.body).toMatchObject({ statusCode: 503, retryAfter: 1 });
  });

  it('hands back to Redis once it answers again', async () => {
    const first = await get('/policies/local', 'back').expect(200);
    expect(first.headers['ratelimit-limit']).toBe('10');
  });
});

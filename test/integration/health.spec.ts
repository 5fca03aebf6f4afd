import { Controller, Get, type INestApplication } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TerminusModule } from '@nestjs/terminus';
import { RateLimit } from 'nest-rate-limit';
import { RedisConfigCentre } from 'nest-rate-limit/live';
import { RateLimitHealthIndicator, rateLimitHealth } from 'nest-rate-limit/ops';
import {
  MemoryRateLimitStore,
  type RateLimitHit,
  type RateLimitSettlement,
  RateLimitStore,
} from 'nest-rate-limit/store';
import request from 'supertest';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller()
class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly rateLimit: RateLimitHealthIndicator,
  ) {}

  @Get('health')
  @HealthCheck()
  check() {
    return this.health.check([() => this.rateLimit.isHealthy()]);
  }

  @Get('limited')
  @RateLimit({ count: 100, window: '1m' })
  limited() {
    return {};
  }
}

describe('the health indicator, through @nestjs/terminus', () => {
  let server: RedisServer | undefined;
  let app: INestApplication | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  afterAll(() => server?.stop());

  const health = () => request(app!.getHttpServer()).get('/health');

  it('healthy, then down when Redis stops, then healthy again', async () => {
    server = await startRedisServer();
    const port = server.port;
    app = await createTestApp({
      controllers: [HealthController],
      imports: [TerminusModule],
      rateLimit: {
        redis: server.url,
        keyPrefix: uniquePrefix(),
        configCentre: RedisConfigCentre,
        storeErrors: { timeoutMs: 100 },
        extensions: [rateLimitHealth()],
      },
    });
    await request(app.getHttpServer()).get('/limited').expect(200);
    const up = await health().expect(200);
    expect(up.body).toMatchObject({
      status: 'ok',
      info: {
        rate_limit: {
          status: 'up',
          store: 'redis',
          redis: 'up',
          breaker: 'closed',
          scriptsLoaded: true,
          liveConfigInSync: true,
        },
      },
    });

    await server.stop();
    const down = await health().expect(503);
    expect(down.body).toMatchObject({
      status: 'error',
      // Redis could not be asked whether it has the scripts: unknown, not a no.
      error: { rate_limit: { status: 'down', redis: 'down', scriptsLoaded: 'unknown' } },
    });

    server = await startRedisServer([], port);
    // The client reconnects on its own schedule; the scripts are loaded again as it does.
    // Degraded (200) while the live limits catch up after the gap, then up.
    await until(async () => (await health()).body.info?.rate_limit?.status === 'up', {
      timeoutMs: 10_000,
      what: 'healthy again',
    });
    expect((await health()).body.info.rate_limit).toMatchObject({ status: 'up', scriptsLoaded: true });
  });

  it('a hung Redis (SIGSTOP) cannot say whether it has the scripts: unknown, then true once it answers', async () => {
    const hung = await startRedisServer();
    try {
      app = await createTestApp({
        controllers: [HealthController],
        imports: [TerminusModule],
        rateLimit: {
          redis: hung.url,
          keyPrefix: uniquePrefix(),
          storeErrors: { timeoutMs: 100 },
          extensions: [rateLimitHealth()],
        },
      });
      await request(app.getHttpServer()).get('/limited').expect(200);
      expect((await health().expect(200)).body.info.rate_limit).toMatchObject({ redis: 'up', scriptsLoaded: true });
      process.kill(hung.pid, 'SIGSTOP');
      try {
        const down = await health().expect(503);
        expect(down.body.error.rate_limit).toMatchObject({ status: 'down', redis: 'down', scriptsLoaded: 'unknown' });
      } finally {
        process.kill(hung.pid, 'SIGCONT');
      }
      // The scripts were there all along.
      await until(async () => (await health()).body.info?.rate_limit?.scriptsLoaded === true, {
        timeoutMs: 5_000,
        what: 'the scripts reported loaded again',
      });
    } finally {
      await app?.close();
      app = undefined;
      await hung.stop();
    }
  });

  it('reports keys without a TTL from the background audit, as degraded', async () => {
    server ??= await startRedisServer();
    const prefix = uniquePrefix();
    const client = server.client();
    await client.set(`${prefix}:{old}:rule:fw`, '3');
    app = await createTestApp({
      controllers: [HealthController],
      imports: [TerminusModule],
      rateLimit: { redis: server.url, keyPrefix: prefix, extensions: [rateLimitHealth()] },
    });
    // The first check starts the audit; a later one reports it.
    await health();
    await until(async () => (await health()).body.info?.rate_limit?.keysWithoutTtl === 1, {
      timeoutMs: 5_000,
      what: 'the audit found the key',
    });
    expect((await health()).body).toMatchObject({ status: 'degraded', info: { rate_limit: { status: 'degraded' } } });
  });

  it('is up on the embedded store', async () => {
    app = await createTestApp({
      controllers: [HealthController],
      imports: [TerminusModule],
      rateLimit: { extensions: [rateLimitHealth()] },
    });
    expect((await health().expect(200)).body.info).toEqual({ rate_limit: { status: 'up', store: 'memory' } });
  });

  it("names a store of the app's own by what it says it is, not 'memory'", async () => {
    // Counts kept in this process, but not the library's in-process store.
    class OwnStore extends RateLimitStore {
      readonly description = 'tenant-sharded store (shared across instances)';
      private readonly counts = new MemoryRateLimitStore(100);
      consume(hits: readonly RateLimitHit[], now?: number) {
        return this.counts.consume(hits, now);
      }
      settle(settlements: readonly RateLimitSettlement[]) {
        return this.counts.settle(settlements);
      }
      record(hits: readonly RateLimitHit[], now?: number) {
        return this.counts.record(hits, now);
      }
      reset(keys: readonly string[]) {
        return this.counts.reset(keys);
      }
    }
    app = await createTestApp({
      controllers: [HealthController],
      imports: [TerminusModule],
      rateLimit: { store: new OwnStore(), extensions: [rateLimitHealth()] },
    });
    expect((await health().expect(200)).body.info).toEqual({
      rate_limit: { status: 'up', store: 'tenant-sharded store (shared across instances)' },
    });
  });
});

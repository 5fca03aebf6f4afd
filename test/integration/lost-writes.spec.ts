import { Controller, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { rateLimitKeys } from 'nest-rate-limit/store';
import { fixedWindowCount, plantFixedWindow } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

@Controller('lost')
class LostController {
  @Get('twenty')
  @RateLimit({ name: 'twenty', count: 20, window: '1h', by: 'global' })
  twenty() {
    return {};
  }

  @Get('five')
  @RateLimit({ name: 'five', count: 5, window: '1h', by: 'global' })
  five() {
    return {};
  }
}

/**
 * A failover to a replica that lacked the last writes leaves the same window's counter lower, and
 * nothing errors. Simulated here by lowering the counter behind the limiter's back.
 */
describe('counts lost behind the limiter’s back (as in a failover)', () => {
  let server: RedisServer;
  let redis: Redis;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
  });

  afterAll(() => server?.stop());

  async function appWith(
    detectLostWrites: boolean,
    lostWriteMarker: number | false = 0.8,
  ): Promise<{ app: INestApplication; prefix: string }> {
    const prefix = uniquePrefix();
    const app = await createTestApp({
      controllers: [LostController],
      rateLimit: {
        redis: server.url,
        keyPrefix: prefix,
        failover: { detectLostWrites, marker: lostWriteMarker },
        // The check itself: the block cache would refuse a full window's requests before Redis is asked.
        blockCache: false,
      },
    });
    return { app, prefix };
  }

  it('decides on the higher figure it saw and raises the counter back', async () => {
    const { app, prefix } = await appWith(true);
    try {
      const { key } = rateLimitKeys(prefix, 'twenty', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/twenty', 10)).toEqual(Array(10).fill(200));
      await plantFixedWindow(redis, key, { count: 2 }); // 8 writes lost
      const next = await request(app.getHttpServer()).get('/lost/twenty').expect(200);
      expect(next.headers['ratelimit-remaining']).toBe('9');
      expect(await fixedWindowCount(redis, key)).toBe(11);
      expect(await statuses(app, '/lost/twenty', 10)).toEqual([...Array(9).fill(200), 429]);
    } finally {
      await app.close();
    }
  });

  it('refuses a request the higher figure refuses, and counts it nowhere', async () => {
    const { app, prefix } = await appWith(true);
    try {
      const { key } = rateLimitKeys(prefix, 'five', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/five', 6)).toEqual([200, 200, 200, 200, 200, 429]);
      await plantFixedWindow(redis, key, { count: 1 });
      await request(app.getHttpServer()).get('/lost/five').expect(429);
      expect(await fixedWindowCount(redis, key)).toBe(5);
    } finally {
      await app.close();
    }
  });

  it('over-admits without the check (failover.detectLostWrites: false), which is what the check prevents', async () => {
    const { app, prefix } = await appWith(false);
    try {
      const { key } = rateLimitKeys(prefix, 'five', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/five', 6)).toEqual([200, 200, 200, 200, 200, 429]);
      await plantFixedWindow(redis, key, { count: 1 });
      expect(await statuses(app, '/lost/five', 5)).toEqual([200, 200, 200, 200, 429]);
    } finally {
      await app.close();
    }
  });

  it('resumes a window whose counter was lost entirely from its marker', async () => {
    const { app, prefix } = await appWith(false);
    try {
      const { key, markerKey } = rateLimitKeys(prefix, 'twenty', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/twenty', 18)).toEqual(Array(18).fill(200));
      // From 16 (80% of 20) on, the count is also in the marker, kept for two windows.
      expect(await fixedWindowCount(redis, markerKey)).toBe(18);
      await redis.del(key);
      expect(await statuses(app, '/lost/twenty', 3)).toEqual([200, 200, 429]);
      expect(await fixedWindowCount(redis, key)).toBe(20);
    } finally {
      await app.close();
    }
  });

  it('tells windows apart by their start on Redis, not by when this instance read the reply', async () => {
    const { app, prefix } = await appWith(true, false);
    try {
      const { key } = rateLimitKeys(prefix, 'five', 'global', 'fixed-window');
      const started = performance.now();
      expect(await statuses(app, '/lost/five', 3)).toEqual([200, 200, 200]);
      // The counter goes, and a new window begins. This instance's clock then reads as far behind
      // as the time since the first window began: as a reply read late after a stalled event loop
      // would date it, the new window's end, on this clock, is the old one's.
      await redis.del(key);
      vi.useFakeTimers({ toFake: ['Date'] });
      vi.setSystemTime(Date.now() - (performance.now() - started));
      const fresh = await request(app.getHttpServer()).get('/lost/five').expect(200);
      vi.useRealTimers();
      // A new window, not the old one with writes lost: counted from 1, not raised back to 4.
      expect(fresh.headers['ratelimit-remaining']).toBe('4');
      expect(await fixedWindowCount(redis, key)).toBe(1);
    } finally {
      vi.useRealTimers();
      await app.close();
    }
  });

  it('starts the window afresh without a marker (failover.marker: false), which is what the marker prevents', async () => {
    const { app, prefix } = await appWith(false, false);
    try {
      const { key, markerKey } = rateLimitKeys(prefix, 'twenty', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/twenty', 18)).toEqual(Array(18).fill(200));
      expect(await redis.exists(markerKey)).toBe(0);
      await redis.del(key);
      expect(await statuses(app, '/lost/twenty', 3)).toEqual([200, 200, 200]);
    } finally {
      await app.close();
    }
  });
});

/** The other four algorithms, one route each: 20 per hour, so nothing refills within a test. */
const OTHER_ALGORITHMS = ['sliding-window', 'sliding-log', 'token-bucket', 'gcra'] as const;

@Controller('lost-by')
class LostByAlgorithmController {
  @Get('sliding-window')
  @RateLimit({ name: 'sliding-window', count: 20, window: '1h', by: 'global', algorithm: 'sliding-window' })
  slidingWindow() {
    return {};
  }

  @Get('sliding-log')
  @RateLimit({ name: 'sliding-log', count: 20, window: '1h', by: 'global', algorithm: 'sliding-log' })
  slidingLog() {
    return {};
  }

  @Get('token-bucket')
  @RateLimit({ name: 'token-bucket', count: 20, window: '1h', by: 'global', algorithm: 'token-bucket' })
  tokenBucket() {
    return {};
  }

  @Get('gcra')
  @RateLimit({ name: 'gcra', count: 20, window: '1h', by: 'global', algorithm: 'gcra' })
  gcra() {
    return {};
  }
}

/**
 * A failover that loses writes, simulated exactly: the state key as it was a few admissions ago
 * (`DUMP`), put back over the newer one (`RESTORE … REPLACE`), as a promoted replica that missed the
 * last writes holds it. Each algorithm's state and repair differ; what the client sees must not.
 */
describe.each(OTHER_ALGORITHMS)('%s: writes lost behind the limiter’s back', (algorithm) => {
  let server: RedisServer;
  let redis: Redis;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
  });

  afterAll(() => server?.stop());

  async function withApp(detectLostWrites: boolean, run: (app: INestApplication, key: string) => Promise<void>) {
    const prefix = uniquePrefix();
    const app = await createTestApp({
      controllers: [LostByAlgorithmController],
      rateLimit: { redis: server.url, keyPrefix: prefix, failover: { detectLostWrites }, blockCache: false },
    });
    try {
      await run(app, rateLimitKeys(prefix, algorithm, 'global', algorithm).key);
    } finally {
      await app.close();
    }
  }

  /** The state after `kept` admissions, put back after `lost` more. */
  async function loseWrites(app: INestApplication, key: string, kept: number, lost: number): Promise<void> {
    const path = `/lost-by/${algorithm}`;
    expect(await statuses(app, path, kept)).toEqual(Array(kept).fill(200));
    const snapshot = await redis.dumpBuffer(key);
    const ttl = await redis.pttl(key);
    expect(await statuses(app, path, lost)).toEqual(Array(lost).fill(200));
    await redis.restore(key, ttl, snapshot!, 'REPLACE');
  }

  it('decides on the higher figure it saw and raises the state back: the hour admits its 20', async () => {
    await withApp(true, async (app, key) => {
      await loseWrites(app, key, 5, 10);
      const next = await request(app.getHttpServer()).get(`/lost-by/${algorithm}`).expect(200);
      expect(next.headers['ratelimit-remaining']).toBe('4');
      expect(await statuses(app, `/lost-by/${algorithm}`, 5)).toEqual([200, 200, 200, 200, 429]);
    });
  });

  it('refuses a request the higher figure refuses, and raises the state to the full 20', async () => {
    await withApp(true, async (app, key) => {
      await loseWrites(app, key, 4, 16);
      expect(await statuses(app, `/lost-by/${algorithm}`, 3)).toEqual([429, 429, 429]);
    });
  });

  it('over-admits without the check (failover.detectLostWrites: false), which is what the check prevents', async () => {
    await withApp(false, async (app, key) => {
      await loseWrites(app, key, 5, 10);
      expect(await statuses(app, `/lost-by/${algorithm}`, 16)).toEqual([...Array(15).fill(200), 429]);
    });
  });
});

/**
 * `failover.detectLostWrites: 'auto'`, the default: the check only where a replica can be promoted.
 * Told apart by what it does to a counter lowered behind the limiter's back, and by its log line.
 */
describe("failover.detectLostWrites: 'auto' (the default)", () => {
  /** How often a server with no replica seen is asked again (the switch's documented 10 s). */
  const REPLICA_LOOKUP_INTERVAL_MS = 10_000;
  const servers: RedisServer[] = [];
  afterAll(() => Promise.all(servers.map((server) => server.stop())));

  async function defaultApp(master: RedisServer, logs: LogCapture) {
    const prefix = uniquePrefix();
    const app = await createTestApp({
      controllers: [LostController],
      // The defaults, but for the block cache, which would answer a full window before Redis is asked.
      rateLimit: { redis: master.url, keyPrefix: prefix, blockCache: false },
      logger: logs,
    });
    return { app, prefix };
  }

  const said = (logs: LogCapture, pattern: RegExp, what: string, timeoutMs = 5_000) =>
    until(() => logs.at('log', pattern).length === 1, { timeoutMs, intervalMs: 20, what });

  /** Another server starts replicating `master`; resolves once the master counts it connected. */
  async function attachReplica(master: RedisServer): Promise<void> {
    servers.push(await startRedisServer(['--replicaof', '127.0.0.1', String(master.port)]));
    const client = master.client();
    await until(async () => (await client.info('replication')).includes('connected_slaves:1'), {
      timeoutMs: 10_000,
      what: 'the master counting its replica',
    });
  }

  /** The lost writes the first suite shows, caught: decided on the higher figure, raised back. */
  async function expectLossCaught(app: INestApplication, prefix: string, redis: Redis): Promise<void> {
    const { key } = rateLimitKeys(prefix, 'twenty', 'global', 'fixed-window');
    expect(await statuses(app, '/lost/twenty', 10)).toEqual(Array(10).fill(200));
    await plantFixedWindow(redis, key, { count: 2 });
    const next = await request(app.getHttpServer()).get('/lost/twenty').expect(200);
    expect(next.headers['ratelimit-remaining']).toBe('9');
    expect(await fixedWindowCount(redis, key)).toBe(11);
  }

  it('is off on a lone server: nothing is remembered, and a lowered counter is taken as Redis reports it', async () => {
    const master = await startRedisServer();
    servers.push(master);
    const logs = new LogCapture();
    const { app, prefix } = await defaultApp(master, logs);
    try {
      await said(logs, /^Lost-write check off: a lone Redis server/, 'the check saying it is off');
      const { key } = rateLimitKeys(prefix, 'five', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/five', 6)).toEqual([200, 200, 200, 200, 200, 429]);
      await plantFixedWindow(master.client(), key, { count: 1 });
      // As with `detectLostWrites: false`: Redis's figure stands.
      expect(await statuses(app, '/lost/five', 5)).toEqual([200, 200, 200, 200, 429]);
      expect(logs.at('log', /Lost-write check on/)).toEqual([]);
    } finally {
      await app.close();
    }
  });

  it('turns on at the next reconnect once the server has a replica, and catches the loss', async () => {
    const master = await startRedisServer();
    servers.push(master);
    const redis = master.client();
    const logs = new LogCapture();
    const { app, prefix } = await defaultApp(master, logs);
    try {
      await said(logs, /^Lost-write check off/, 'the check saying it is off');
      await attachReplica(master);
      // The library's connection drops (a network blip, a restart): it asks again once it is back.
      const clients = String(await redis.call('CLIENT', 'LIST'));
      const id = /^id=(\d+) .*name=rate-limit /m.exec(clients)?.[1];
      expect(id, 'the library’s connection').toBeDefined();
      await redis.call('CLIENT', 'KILL', 'ID', id!);
      await said(logs, /^Lost-write check on: the server reports 1 connected replica/, 'the check turning on');
      await expectLossCaught(app, prefix, redis);
    } finally {
      await app.close();
    }
  });

  it(`turns on within ${REPLICA_LOOKUP_INTERVAL_MS / 1000} s of a replica attaching while connected, and catches the loss`, async () => {
    const master = await startRedisServer();
    servers.push(master);
    const logs = new LogCapture();
    const { app, prefix } = await defaultApp(master, logs);
    try {
      await said(logs, /^Lost-write check off/, 'the check saying it is off');
      await attachReplica(master);
      await said(
        logs,
        /^Lost-write check on: the server reports 1 connected replica/,
        'the check turning on',
        REPLICA_LOOKUP_INTERVAL_MS + 5_000,
      );
      await expectLossCaught(app, prefix, master.client());
    } finally {
      await app.close();
    }
  });

  it('an explicit false wins over a replica', async () => {
    const master = await startRedisServer();
    servers.push(master);
    await attachReplica(master);
    const logs = new LogCapture();
    const prefix = uniquePrefix();
    const app = await createTestApp({
      controllers: [LostController],
      rateLimit: { redis: master.url, keyPrefix: prefix, blockCache: false, failover: { detectLostWrites: false } },
      logger: logs,
    });
    try {
      const { key } = rateLimitKeys(prefix, 'five', 'global', 'fixed-window');
      expect(await statuses(app, '/lost/five', 6)).toEqual([200, 200, 200, 200, 200, 429]);
      await plantFixedWindow(master.client(), key, { count: 1 });
      expect(await statuses(app, '/lost/five', 5)).toEqual([200, 200, 200, 200, 429]);
      expect(logs.at('log', /Lost-write check/)).toEqual([]);
    } finally {
      await app.close();
    }
  });
});

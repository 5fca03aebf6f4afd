import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RateLimitHealth, RateLimitHealthIndicator, rateLimitHealth } from 'nest-rate-limit/ops';
import { LogCapture } from '../support/log-capture.js';
import { startRedisServer } from '../support/redis-server.js';
import { fill } from '../support/fill-redis.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/*
 * A full Redis, under each maxmemory-policy. Every rate-limit key carries a TTL, so every evicting
 * policy (allkeys-* and volatile-* alike) may evict counters, lifting lockouts: the library warns at
 * startup and its health check reports 'degraded' while keys are evicted. Under noeviction a full
 * Redis refuses writes with OOM: requests are decided by the store-error policy, never a 500, and
 * the failures are logged by sampling.
 */

const POLICIES = [
  'noeviction',
  'allkeys-lru',
  'allkeys-lfu',
  'allkeys-random',
  'volatile-lru',
  'volatile-lfu',
  'volatile-random',
  'volatile-ttl',
] as const;

const byUser = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

@Controller()
class LoginController {
  @Get('login')
  @RateLimit({ count: 3, window: '1h', by: byUser })
  login() {
    return {};
  }
}

interface Seen {
  warned: boolean;
  filled: 'refused' | 'taken';
  lockout: number;
  newcomers: number[];
  health: RateLimitHealth;
  storeErrorLines: number;
  /** The app's keys in Redis (the locked-out user's counter, the rule catalogue) before the fill, and after it. */
  keys: [number, number];
}

async function underPolicy(policy: string): Promise<Seen> {
  const server = await startRedisServer(['--maxmemory', '2mb', '--maxmemory-policy', policy]);
  const logs = new LogCapture();
  const keyPrefix = uniquePrefix();
  let app: INestApplication | undefined;
  try {
    app = await createTestApp({
      controllers: [LoginController],
      rateLimit: { redis: server.url, keyPrefix, extensions: [rateLimitHealth()] },
      logger: logs,
    });
    const login = (user: string) => request(app!.getHttpServer()).get('/login').set('x-user', user);
    // A brute force locked out: 3 tries, then 429.
    for (let i = 0; i < 3; i += 1) await login('victim').expect(200);
    await login('victim').expect(429);
    const health = app.get(RateLimitHealthIndicator);
    await health.isHealthy(); // notes evicted_keys before the fill

    const countKeys = async () => (await server.client().keys(`${keyPrefix}:*`)).length;
    const before = await countKeys();
    const filled = await fill(server);
    const after = await countKeys();
    const lockout = (await login('victim')).status;
    const newcomers: number[] = [];
    for (let i = 0; i < 20; i += 1) newcomers.push((await login(`newcomer-${i}`)).status);
    const { rate_limit } = await health.isHealthy();
    return {
      warned: logs.at('warn', /evicts keys when full/).length > 0,
      filled,
      lockout,
      newcomers,
      health: rate_limit,
      storeErrorLines: logs.at('error', /Rate-limit store failed/).length,
      keys: [before, after],
    };
  } finally {
    await app?.close();
    await server.stop();
  }
}

describe('a full Redis (maxmemory 2mb), under each maxmemory-policy', () => {
  const seen = new Map<string, Seen>();

  afterAll(() => {
    console.log(
      [
        '| maxmemory-policy | warned at startup | 8 MB of cache written | rate-limit keys before, after | locked-out user then gets | 20 new users get | health | evicted_keys | store-error log lines |',
        '|---|---|---|---|---|---|---|---|---|',
        ...[...seen].map(
          ([policy, s]) =>
            `| ${policy} | ${s.warned ? 'yes' : 'no'} | ${s.filled === 'refused' ? 'refused (OOM)' : 'taken'} | ${s.keys.join(', ')} | ${s.lockout} | ${[...new Set(s.newcomers)].join(', ')} | ${s.health.status} | ${s.health.memory?.evictedKeys} | ${s.storeErrorLines} |`,
        ),
      ].join('\n'),
    );
  });

  it.each(POLICIES)(
    '%s',
    async (policy) => {
      const s = await underPolicy(policy);
      seen.set(policy, s);
      expect(s.health.memory).toMatchObject({ maxmemory: 2 * 1024 * 1024, policy });
      if (policy === 'noeviction') {
        expect(s.warned).toBe(false);
        expect(s.filled).toBe('refused');
        // Writes refused with OOM: the store-error policy ('local') decides. The lockout holds (the
        // fallback knows the count Redis last reported), newcomers get the fallback's share, nothing
        // is a 500, and 21 failures write a line or two.
        expect(s.lockout).toBe(429);
        expect(s.newcomers.every((status) => status === 200 || status === 429)).toBe(true);
        expect(s.newcomers).toContain(200);
        // One line per kind of failure (the OOM, then the circuit it opened), never one per request.
        expect(s.storeErrorLines).toBeGreaterThanOrEqual(1);
        expect(s.storeErrorLines).toBeLessThanOrEqual(2);
        expect(s.health.memory?.evicting).toBe(false);
      } else {
        // Warned at startup, and the health check says counters may be lost while keys are evicted.
        expect(s.warned).toBe(true);
        expect(s.filled).toBe('taken');
        // The counters went with the cache (the locked-out user is still refused here only because
        // this instance's block cache holds the refusal; another instance would admit them).
        expect(s.keys[1]).toBeLessThan(s.keys[0]);
        expect(s.health.memory?.evictedKeys).toBeGreaterThan(0);
        expect(s.health.memory?.evicting).toBe(true);
        expect(s.health.status).toBe('degraded');
        expect([...s.newcomers, s.lockout].every((status) => status === 200 || status === 429)).toBe(true);
      }
    },
    30_000,
  );
});

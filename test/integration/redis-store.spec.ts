import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisRateLimitStore, RedisService } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';

describe('Redis store (fixed-window Lua script) against a real Redis', () => {
  let server: RedisServer;
  let redis: Redis;
  let service: RedisService;
  let store: RedisRateLimitStore;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    service = new RedisService({ redis: server.url, redisTimeoutMs: 1_000 });
    await service.onModuleInit();
    store = new RedisRateLimitStore(service);
  });

  afterAll(async () => {
    await service?.onApplicationShutdown();
    await server?.stop();
  });

  async function keysWithoutTtl(pattern: string): Promise<string[]> {
    const keys = await redis.keys(pattern);
    const ttls = await Promise.all(keys.map((key) => redis.pttl(key)));
    return keys.filter((_, i) => ttls[i] === -1);
  }

  it('never leaves a key without a TTL when requests arrive as the key expires', async () => {
    const prefix = uniquePrefix();
    const admitted: number[] = [];
    for (let round = 0; round < 100; round += 1) {
      const key = `${prefix}:edge:${round}`;
      // Near the limit, about to expire: some hits land before the expiry, some after.
      await redis.set(key, '2', 'PX', 3);
      const decisions = await Promise.all(
        Array.from(
          { length: 8 },
          (_, i) =>
            new Promise<boolean>((resolve, reject) => {
              setTimeout(
                () => store.hit({ key, limit: 3, windowMs: 60_000, cost: 1 }).then((d) => resolve(d.allowed), reject),
                i,
              );
            }),
        ),
      );
      admitted.push(decisions.filter(Boolean).length);
      const ttl = await redis.pttl(key);
      expect(ttl, `round ${round}`).toBeGreaterThan(0);
      expect(Number(await redis.get(key))).toBeLessThanOrEqual(3);
    }
    expect(await keysWithoutTtl(`${prefix}:*`)).toEqual([]);
    // Both sides of the expiry were exercised: rounds where only the old window's last slot was
    // taken (1 admitted) and rounds that reached a new window (more than 1 admitted).
    expect(admitted.some((n) => n > 1)).toBe(true);
  });

  it('repairs a key left without a TTL on the next request, admitted or not', async () => {
    const prefix = uniquePrefix();
    await redis.set(`${prefix}:planted:over`, '7');
    await redis.set(`${prefix}:planted:under`, '1');
    expect(await keysWithoutTtl(`${prefix}:*`)).toHaveLength(2);

    const over = await store.hit({ key: `${prefix}:planted:over`, limit: 3, windowMs: 5_000, cost: 1 });
    const under = await store.hit({ key: `${prefix}:planted:under`, limit: 3, windowMs: 5_000, cost: 1 });

    expect(over).toMatchObject({ allowed: false, remaining: 0 });
    expect(under).toMatchObject({ allowed: true, remaining: 1 });
    expect(await keysWithoutTtl(`${prefix}:*`)).toEqual([]);
    expect(await redis.pttl(`${prefix}:planted:over`)).toBeLessThanOrEqual(5_000);
    expect(await redis.get(`${prefix}:planted:over`)).toBe('7');
    expect(await redis.get(`${prefix}:planted:under`)).toBe('2');
  });

  it('keeps counting correctly after SCRIPT FLUSH, re-sending the script on NOSCRIPT', async () => {
    const key = `${uniquePrefix()}:flush:user`;
    const before = await redis.info('commandstats');
    expect(evalCalls(before, 'eval')).toBe(0);

    const results = [];
    for (let i = 0; i < 4; i += 1) {
      await redis.script('FLUSH');
      results.push(await store.hit({ key, limit: 3, windowMs: 60_000, cost: 1 }));
    }
    expect(results.map((r) => r.allowed)).toEqual([true, true, true, false]);
    expect(results.map((r) => r.remaining)).toEqual([2, 1, 0, 0]);
    expect(await redis.get(key)).toBe('3');
    // Every EVALSHA after a flush met NOSCRIPT and was answered by an EVAL.
    const after = await redis.info('commandstats');
    expect(evalCalls(after, 'eval')).toBe(4);
  });

  it('returns the window left in the counter as resetMs', async () => {
    const key = `${uniquePrefix()}:reset:user`;
    const first = await store.hit({ key, limit: 5, windowMs: 10_000, cost: 1 });
    expect(first.resetMs).toBeGreaterThan(9_000);
    expect(first.resetMs).toBeLessThanOrEqual(10_000);
    expect(first).toMatchObject({ allowed: true, limit: 5, remaining: 4 });
  });
});

function evalCalls(info: string, command: string): number {
  const match = new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info);
  return match ? Number(match[1]) : 0;
}

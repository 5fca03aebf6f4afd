import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitStore } from 'nest-rate-limit/store';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/** Reads Redis has made of its clients' sockets so far (INFO stats). */
async function readsProcessed(redis: Redis): Promise<number> {
  return Number(/total_reads_processed:(\d+)/.exec(await redis.info('stats'))?.[1]);
}

describe('the calls of one turn of the event loop go to Redis in one write', () => {
  let server: RedisServer;
  let redis: Redis;
  let store: RateLimitStore;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    ({ store, close } = await createStore({ redis: server.url }));
    // Connected, and the scripts loaded.
    await store.consume([hit(`${uniquePrefix()}:{warm}:r:fw`, { limit: 10, windowMs: 60_000 })]);
  });

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  it('reads 100 concurrent decisions in one go, each decided and counted', async () => {
    const prefix = uniquePrefix();
    const rounds: number[] = [];
    for (let round = 0; round < 5; round += 1) {
      const before = await readsProcessed(redis);
      const keys = Array.from({ length: 100 }, (_, i) => `${prefix}:{id${i}}:r${round}:fw`);
      const consumptions = await Promise.all(
        keys.map((key) => store.consume([hit(key, { limit: 10, windowMs: 60_000 })])),
      );
      // Less the INFO call that reads the figure.
      rounds.push((await readsProcessed(redis)) - before - 1);
      expect(consumptions.every((consumption) => consumption.allowed && consumption.decisions[0].remaining === 9)).toBe(
        true,
      );
      expect(await redis.mget(keys)).toEqual(keys.map(() => '1'));
    }
    // One write per turn: Redis reads it at once (a read may split where the socket buffer does).
    expect(
      rounds.every((reads) => reads <= 2),
      `reads per round: ${rounds.join(', ')}`,
    ).toBe(true);
  });
});

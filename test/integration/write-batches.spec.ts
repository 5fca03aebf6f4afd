import type { Socket } from 'node:net';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitStore, RedisService } from 'nest-rate-limit/store';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/** Counts the writes (system calls' worth) the socket makes while `work` runs. */
async function writesDuring(socket: Socket, work: () => Promise<unknown>): Promise<number> {
  const internals = socket as unknown as {
    _write: (...args: unknown[]) => unknown;
    _writev: (...args: unknown[]) => unknown;
  };
  const { _write: write, _writev: writev } = internals;
  let writes = 0;
  internals._write = (...args) => {
    writes += 1;
    return write.apply(socket, args);
  };
  internals._writev = (...args) => {
    writes += 1;
    return writev.apply(socket, args);
  };
  try {
    await work();
  } finally {
    internals._write = write;
    internals._writev = writev;
  }
  return writes;
}

describe('the calls of one turn of the event loop go to Redis in writes of at most eight', () => {
  let server: RedisServer;
  let redis: Redis;
  let store: RateLimitStore;
  let service: RedisService;
  let close: () => Promise<void>;

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    ({ store, redis: service, close } = await createStore({ redis: server.url }));
    // Connected, and the scripts loaded.
    await store.consume([hit(`${uniquePrefix()}:{warm}:r:fw`, { limit: 10, windowMs: 60_000 })]);
  });

  afterAll(async () => {
    await close?.();
    await server?.stop();
  });

  it('writes 100 concurrent decisions in 13 writes of at most 8 after the first, each decided and counted', async () => {
    const prefix = uniquePrefix();
    const socket = (service.client as Redis).stream as Socket;
    for (let round = 0; round < 3; round += 1) {
      const keys = Array.from({ length: 100 }, (_, i) => `${prefix}:{id${i}}:r${round}:fw`);
      // A lone call before, as the warm-up's and each round's last: the first of the burst looks lone too.
      await store.consume([hit(`${prefix}:{lone}:r${round}:fw`, { limit: 10, windowMs: 60_000 })]);
      let consumptions: Awaited<ReturnType<RateLimitStore['consume']>>[] = [];
      const writes = await writesDuring(socket, async () => {
        consumptions = await Promise.all(keys.map((key) => store.consume([hit(key, { limit: 10, windowMs: 60_000 })])));
      });
      // Sent one by one they would take 100; all in one, Redis would wait for the last to start. The
      // first goes alone (none was in flight, and the call before went alone), then 12 of 8 and one of 3.
      expect(writes).toBe(14);
      expect(consumptions.every((consumption) => consumption.allowed && consumption.decisions[0].remaining === 9)).toBe(
        true,
      );
      expect(await redis.mget(keys)).toEqual(keys.map(() => '1'));
    }
  });

  it('writes a lone call at once, not at the end of the turn, and one per call while each waits for its answer', async () => {
    const prefix = uniquePrefix();
    const socket = (service.client as Redis).stream as Socket;
    const lone = () => store.consume([hit(`${prefix}:{lone}:fw`, { limit: 100, windowMs: 60_000 })]);
    // The turn of the call before decides: the last test's burst held many, this call one.
    await lone();
    const writes = await writesDuring(socket, async () => {
      for (let i = 0; i < 20; i += 1) {
        const call = lone();
        // Written before this turn ends: a held call would be in the socket, corked until then.
        expect({ call: i, corked: socket.writableCorked }).toEqual({ call: i, corked: 0 });
        expect((await call).decisions[0].remaining).toBe(98 - i);
      }
    });
    expect(writes).toBe(20);
  });
});

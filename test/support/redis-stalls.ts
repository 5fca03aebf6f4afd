import type { RedisServer } from './redis-server.js';

/** A Redis kept busy by `stallRedis`; `ends`: when each stall ended (`performance.now()`). */
export interface RedisStalls {
  stop(): Promise<void>;
  readonly ends: number[];
}

/**
 * Keeps Redis busy `stallMs` at a time with a script that spins, as a slow command (a big KEYS) or
 * a fork for a snapshot does: a stall starts every `everyMs`, or as soon as the last one ends.
 * Redis then runs the calls it held, and answers them late.
 */
export function stallRedis(server: RedisServer, stallMs: number, everyMs: number): RedisStalls {
  const client = server.client();
  const spin = `local t0 = redis.call('TIME')
local start = t0[1] * 1000000 + t0[2]
repeat local t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1`;
  let running = true;
  const ends: number[] = [];
  const loop = (async () => {
    while (running) {
      const started = performance.now();
      await client.eval(spin, 0, stallMs * 1000);
      ends.push(performance.now());
      const rest = everyMs - (performance.now() - started);
      if (rest > 0) await new Promise((resolve) => setTimeout(resolve, rest));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      client.disconnect();
    },
    ends,
  };
}

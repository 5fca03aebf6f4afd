import type { Redis } from 'ioredis';

/** What the server needs for the firm signal below; without it the readings only wait to agree. */
export const REDIS_MEMORY_ARGS = ['--enable-debug-command', 'local'] as const;

/** The longest a reading waits for Redis to settle, and the gap between two readings that must agree. */
const SETTLE_MS = 5_000;
const READINGS_APART_MS = 100;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function usedMemory(client: Redis): Promise<number> {
  return Number(/used_memory:(\d+)/.exec(await client.info('memory'))![1]);
}

/**
 * Whether db 0's keys or expiries are between two hash tables (`DEBUG HTSTATS` lists a "rehashing
 * target"); `undefined` where the server refuses DEBUG.
 */
async function rehashing(client: Redis): Promise<boolean | undefined> {
  try {
    return String(await client.call('DEBUG', 'HTSTATS', '0')).includes('rehashing target');
  } catch {
    return undefined;
  }
}

/**
 * used_memory once Redis has settled. A dict grows by doubling (10,000 keys cross 8,192) and moves
 * its entries to the new table a few at a time, by commands and by 1 ms of each cron tick (every
 * 100 ms at the default `hz`), the keys' dict first, then the expiries'. Until both are done the old
 * tables are counted too: 13 bytes a key for 10,000 keys. So this waits until neither rehashes, then
 * until two readings 100 ms apart agree (client buffers shrink in the cron too), at most 5 s.
 */
async function settledMemory(client: Redis): Promise<number> {
  const deadline = performance.now() + SETTLE_MS;
  while ((await rehashing(client)) === true && performance.now() < deadline) await sleep(READINGS_APART_MS);
  let last = await usedMemory(client);
  while (performance.now() < deadline) {
    await sleep(READINGS_APART_MS);
    const now = await usedMemory(client);
    if (now === last) break;
    last = now;
  }
  return last;
}

/**
 * Redis bytes per key: used_memory, settled, before and after `keys` fresh keys written 100 at a time
 * on an emptied server; the median of `runs` measurements.
 */
export async function redisBytesPerKey(
  client: Redis,
  write: (key: number) => Promise<unknown>,
  { keys = 10_000, runs = 3 }: { keys?: number; runs?: number } = {},
): Promise<number> {
  const measured: number[] = [];
  for (let run = 0; run < runs; run += 1) {
    await client.flushall();
    const before = await settledMemory(client);
    for (let i = 0; i < keys; i += 100) {
      await Promise.all(Array.from({ length: Math.min(100, keys - i) }, (_, j) => write(i + j)));
    }
    measured.push(((await settledMemory(client)) - before) / keys);
  }
  measured.sort((a, b) => a - b);
  return measured[Math.floor(measured.length / 2)];
}

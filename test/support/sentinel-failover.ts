import type { Redis } from 'ioredis';
import { fixedWindowCount } from './inspect.js';
import { until } from './poll.js';
import type { RedisSentinelSet } from './redis-server.js';

/** Asks the sentinels for a failover and waits until the replica is the master; a client of it. */
export async function failOver(set: RedisSentinelSet): Promise<Redis> {
  await set.sentinels[0].client().call('SENTINEL', 'FAILOVER', set.name);
  const replica = set.replica.client();
  await until(async () => (await replica.info('replication')).includes('role:master'), {
    timeoutMs: 15_000,
    intervalMs: 50,
    what: 'the replica becoming the master',
  });
  return replica;
}

/**
 * Calls `consume` until the new master holds at least `count` at the fixed-window `key`: the client
 * follows the sentinels to it, and until it does, calls may fail or land on the old master (and be
 * lost when it becomes a replica).
 */
export async function untilCountedOn(
  master: Redis,
  key: string,
  count: number,
  consume: () => Promise<unknown>,
): Promise<void> {
  await until(
    async () => {
      await consume().catch(() => undefined);
      return ((await fixedWindowCount(master, key)) ?? 0) >= count;
    },
    { timeoutMs: 15_000, intervalMs: 50, what: `a count of ${count} on the new master` },
  );
}

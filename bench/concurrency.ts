/**
 * Concurrency caps and waiting, side by side with the peers that have the feature, on a Redis of
 * its own:
 *
 * - Caps: a request takes a slot and gives it back. Ours (`RateLimiterService.consume` with
 *   `{ concurrency }`, then `settle`), a Redis semaphore written the usual way (a sorted set of
 *   holders scored by time: one script drops holders past their lease, counts, adds; a ZREM gives
 *   the slot back), and the floor for two round trips (two EVALSHAs of a script that returns 1).
 *   16 requests in flight over 1,000 identities, each for a few rounds (medians): requests a second,
 *   p99 of acquire-and-release, app and Redis CPU per request.
 * - Waiting: 200 requests at once at 50 a second for one identity, each waiting up to 10 s. Ours
 *   (`wait: { maxMs }`) against rate-limiter-flexible's `RateLimiterQueue` over its Redis limiter:
 *   the time until the last is admitted (the limit alone makes it 3 s or more), the median and p99
 *   wait, and the store calls per admitted request.
 *
 * Store calls are counted by Redis's MONITOR, in a pass of their own: commands sent by clients,
 * not those scripts run. A count of calls is the same on any machine; the times are for comparing
 * in one run only.
 *
 *   npm run bench:concurrency
 */
import { Redis } from 'ioredis';
import { RateLimiterQueue, RateLimiterRedis } from 'rate-limiter-flexible';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore } from '../test/support/store-module.js';
import { type Decide, type DecisionsMeasured, measureDecisions } from './support/measure-decisions.js';

const IDENTITIES = 1_000;
const IN_FLIGHT = 16;
const CALLS = 40_000;
const MAX_MS = 4_000;
const ROUNDS = 3;
const SLOTS = 64;
const LEASE_MS = 30_000;
/** Requests sent at once in the waiting scenario, and the limit they wait for. */
const BURST = 200;
const PER_SECOND = 50;

const SEMAPHORE_ACQUIRE = `
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`;

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

/** Commands clients sent while `run` ran, as MONITOR sees them (not those of scripts, nor MONITOR's own). */
async function storeCalls(url: string, run: () => Promise<void>): Promise<number> {
  const watcher = new Redis(url, { lazyConnect: true });
  await watcher.connect();
  const monitor = await watcher.monitor();
  let calls = 0;
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (!source.startsWith('lua') && args[0]?.toLowerCase() !== 'info') calls += 1;
  });
  await run();
  // MONITOR's last lines may still be on their way.
  await new Promise((resolve) => setTimeout(resolve, 100));
  monitor.disconnect();
  watcher.disconnect();
  return calls;
}

async function main(): Promise<void> {
  const server = await startRedisServer();
  const client = new Redis(server.url);
  const { limiter, close } = await createStore({ redis: server.url, keyPrefix: 'bc' });
  client.defineCommand('semaphoreAcquire', { numberOfKeys: 1, lua: SEMAPHORE_ACQUIRE });
  client.defineCommand('bareOne', { numberOfKeys: 1, lua: 'return 1' });
  const semaphore = client as Redis & {
    semaphoreAcquire(key: string, now: number, lease: number, slots: number, holder: string): Promise<number>;
    bareOne(key: string): Promise<number>;
  };
  let holders = 0;
  const cap = { name: 'bench-cap', concurrency: SLOTS } as const;

  const caps: Record<string, Decide> = {
    'floor: two EVALSHAs': async (key) => {
      await semaphore.bareOne(`bare:{${key}}`);
      await semaphore.bareOne(`bare:{${key}}`);
    },
    'Redis semaphore (sorted set, ZREM)': async (key) => {
      const holder = String((holders += 1));
      const taken = await semaphore.semaphoreAcquire(`sem:{${key}}`, Date.now(), LEASE_MS, SLOTS, holder);
      if (taken === 1) await client.zrem(`sem:{${key}}`, holder);
    },
    'ours: consume + settle': async (key) => {
      const outcome = await limiter.consume(cap, String(key));
      await limiter.settle(outcome, true);
    },
  };

  console.log(
    `## Caps: take a slot and give it back (${IN_FLIGHT} in flight, ${IDENTITIES} identities, ${SLOTS} slots)\n`,
  );
  console.log('| contender | requests/s | p99 ms | app µs/request | Redis µs/request | store calls/request |');
  console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
  for (const [name, decide] of Object.entries(caps)) {
    await measureDecisions(client, decide, { inFlight: IN_FLIGHT, keys: IDENTITIES, calls: 2_000, maxMs: 1_000 });
    const rounds: DecisionsMeasured[] = [];
    for (let round = 0; round < ROUNDS; round += 1) {
      rounds.push(
        await measureDecisions(client, decide, { inFlight: IN_FLIGHT, keys: IDENTITIES, calls: CALLS, maxMs: MAX_MS }),
      );
    }
    const requests = 1_000;
    const calls = await storeCalls(server.url, async () => {
      await measureDecisions(client, decide, { inFlight: IN_FLIGHT, keys: IDENTITIES, calls: requests, maxMs: 10_000 });
    });
    const m = (pick: (r: DecisionsMeasured) => number) => median(rounds.map(pick));
    console.log(
      `| ${name} | ${m((r) => r.perSecond).toFixed(0)} | ${m((r) => r.p99Ms).toFixed(2)} | ${m((r) => r.nodeUs).toFixed(1)} | ${m((r) => r.redisUs).toFixed(1)} | ${(calls / requests).toFixed(2)} |`,
    );
  }

  const waits: Record<string, (round: number) => () => Promise<unknown>> = {
    'rate-limiter-flexible RateLimiterQueue': (round) => {
      const queue = new RateLimiterQueue(
        new RateLimiterRedis({ storeClient: client, points: PER_SECOND, duration: 1, keyPrefix: `rlfq${round}` }),
        { maxQueueSize: BURST },
      );
      return () => queue.removeTokens(1, 'burst');
    },
    'ours: wait': (round) => {
      const rule = {
        name: `bench-wait-${round}`,
        count: PER_SECOND,
        window: '1s',
        wait: { maxMs: 10_000, maxQueued: BURST },
      };
      return async () => {
        const outcome = await limiter.consume(rule, 'burst');
        if (!outcome.allowed) throw new Error('refused');
      };
    },
  };

  console.log(`\n## Waiting: ${BURST} requests at once at ${PER_SECOND} a second, up to 10 s each\n`);
  console.log('| contender | last admitted at, s | median wait, s | p99 wait, s | admitted | store calls/admitted |');
  console.log('| --- | ---: | ---: | ---: | ---: | ---: |');
  let round = 0;
  for (const [name, make] of Object.entries(waits)) {
    let result = { last: 0, waits: [] as number[], admitted: 0 };
    const calls = await storeCalls(server.url, async () => {
      round += 1;
      const take = make(round);
      const started = performance.now();
      const waited = await Promise.all(
        Array.from({ length: BURST }, () =>
          take().then(
            () => (performance.now() - started) / 1000,
            () => undefined,
          ),
        ),
      );
      const admitted = waited.filter((seconds): seconds is number => seconds !== undefined).sort((a, b) => a - b);
      result = { last: admitted.at(-1) ?? 0, waits: admitted, admitted: admitted.length };
    });
    const { waits: w } = result;
    console.log(
      `| ${name} | ${result.last.toFixed(2)} | ${median(w).toFixed(2)} | ${w[Math.floor(w.length * 0.99)].toFixed(2)} | ${result.admitted} | ${(calls / result.admitted).toFixed(2)} |`,
    );
  }

  await close();
  client.disconnect();
  await server.stop();
}

await main();

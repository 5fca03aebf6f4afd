/**
 * Decisions per second of one fixed-window rule against one Redis, side by side in one run: a bare
 * one-EVALSHA fixed window (the floor), rate-limiter-flexible's RateLimiterRedis, this library's
 * store call, and its whole decision outside HTTP (`RateLimiterService.consume`: thresholds, keys,
 * deadline, breaker, lost-write check, fallback bookkeeping). Each is driven at 1, 16 and 128 calls
 * in flight, on one hot key and on 10,000 distinct keys, with a limit no call reaches. Figures are
 * ratios to the floor measured in the same round; rounds alternate the order of the contenders so
 * that drift in the machine falls on all of them, and each cell keeps its best of three rounds.
 *
 *   npm run bench:peers
 */
import { Redis } from 'ioredis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore, hit } from '../test/support/store-module.js';

const IN_FLIGHT = [1, 16, 128] as const;
const KEYS = { hot: 1, '10k keys': 10_000 } as const;
/** Calls per measurement, and a bound in time whichever comes first. */
const CALLS = 20_000;
const MAX_MS = 4_000;
const ROUNDS = 3;
/** Calls each contender makes first, so no measurement includes JIT warm-up or connection set-up. */
const WARM_UP = 5_000;
const HUGE = 1_000_000_000;

/** The floor: a fixed window in one script, INCR and PEXPIRE atomically. */
const FLOOR_LUA = `
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return count`;

type Decide = (key: number) => Promise<unknown>;

interface Result {
  perSecond: number;
  p99Ms: number;
}

/** Runs `CALLS` decisions with `inFlight` outstanding at once, over `keys` keys in turn. */
async function measure(decide: Decide, inFlight: number, keys: number): Promise<Result> {
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  const deadline = started + MAX_MS;
  const worker = async () => {
    while (next < CALLS && performance.now() < deadline) {
      const key = next % keys;
      next += 1;
      const at = performance.now();
      await decide(key);
      latencies.push(performance.now() - at);
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
  const elapsed = performance.now() - started;
  latencies.sort((a, b) => a - b);
  return {
    perSecond: (latencies.length / elapsed) * 1000,
    p99Ms: latencies[Math.floor(latencies.length * 0.99)] ?? 0,
  };
}

async function main(): Promise<void> {
  const server = await startRedisServer();
  const client = new Redis(server.url);
  const floorSha = String(await client.script('LOAD', FLOOR_LUA));
  const flexible = new RateLimiterRedis({ storeClient: client, points: HUGE, duration: 60, keyPrefix: 'rlf' });
  const { store, limiter, close } = await createStore({ redis: server.url });
  const rule = { name: 'bench', count: HUGE, window: '1m' } as const;

  const contenders: Record<string, Decide> = {
    'one-EVALSHA floor': (key) => client.evalsha(floorSha, 1, `floor:{${key}}`, 60_000),
    'rate-limiter-flexible': (key) => flexible.consume(String(key)),
    'ours: store call': (key) => store.consume([hit(`rl:{${key}}:bench:fw`, { limit: HUGE, windowMs: 60_000 })]),
    'ours: RateLimiterService.consume': (key) => limiter.consume(rule, String(key)),
  };

  const names = Object.keys(contenders);
  const best = new Map<string, Result>();
  try {
    for (const name of names) {
      for (let i = 0; i < WARM_UP; i += 16)
        await Promise.all(Array.from({ length: 16 }, (_, j) => contenders[name](i + j)));
    }
    for (let round = 0; round < ROUNDS; round += 1) {
      const order = round % 2 === 0 ? names : [...names].reverse();
      for (const [keysName, keys] of Object.entries(KEYS)) {
        for (const inFlight of IN_FLIGHT) {
          for (const name of order) {
            const id = `${name}|${keysName}|${inFlight}`;
            const result = await measure(contenders[name], inFlight, keys);
            const kept = best.get(id);
            if (!kept || result.perSecond > kept.perSecond) best.set(id, result);
          }
        }
      }
    }
    const rows = ['| contender | keys | in flight | decisions/s | x floor | p99 ms |', '|---|---|---|---|---|---|'];
    for (const keysName of Object.keys(KEYS)) {
      for (const inFlight of IN_FLIGHT) {
        const floor = best.get(`${names[0]}|${keysName}|${inFlight}`)!;
        for (const name of names) {
          const result = best.get(`${name}|${keysName}|${inFlight}`)!;
          rows.push(
            `| ${name} | ${keysName} | ${inFlight} | ${Math.round(result.perSecond)} | ` +
              `${(result.perSecond / floor.perSecond).toFixed(2)} | ${result.p99Ms.toFixed(2)} |`,
          );
        }
      }
    }
    console.log(rows.join('\n'));
  } finally {
    await close();
    client.disconnect();
    await server.stop();
  }
}

await main();

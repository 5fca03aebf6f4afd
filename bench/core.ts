/**
 * The cost of a decision against one Redis, side by side in one run: a bare one-EVALSHA fixed window
 * (the floor), rate-limiter-flexible's RateLimiterRedis (with and without its in-memory block), this
 * library's store call, its whole decision outside HTTP (`RateLimiterService.consume`: thresholds,
 * keys, deadline, breaker, block cache, fallback bookkeeping), and the same through the guard as
 * Nest calls it for a request (`bench/support/guard-path.ts`: execution context, client address,
 * headers, the 429), all on the module's defaults.
 *
 * - admitting: one fixed-window rule with a limit no call reaches, at 1, 16 and 128 calls in flight,
 *   on one hot key and on 10,000 distinct keys;
 * - attack: one hot key over its limit (5 a minute), so nearly every decision is a refusal;
 * - three rules on one decision (one round trip for ours, one per rule for the peer);
 * - a hot global key: one counter for every decision, where one Redis key is the ceiling, without
 *   and with leases (`lease`: each instance takes a batch of units at once);
 * - Redis memory per fixed-window key, and Redis CPU per decision for each of our algorithms;
 * - the embedded store (no Redis): decisions/s on a hot key and on 100,000 keys, and its memory
 *   under a flood of distinct keys.
 *
 * Figures are ratios to the floor measured in the same round; rounds alternate the order of the
 * contenders so that drift in the machine falls on all of them, and each cell keeps its median of
 * three rounds. Node CPU is this process's per decision (the load loop's share is the same for
 * all); Redis CPU is the server's `used_cpu_user + used_cpu_sys` over the same decisions.
 *
 *   npm run bench:core          (QUICK=1 for one round of fewer calls)
 */
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import { rateLimitMetrics } from 'nest-rate-limit/ops';
import { ALGORITHM_NAMES, ruleKeyId } from 'nest-rate-limit/store';
import { startRedisServer } from '../test/support/redis-server.js';
import { REDIS_MEMORY_ARGS, redisBytesPerKey } from './support/redis-memory.js';
import { createStore, hit } from '../test/support/store-module.js';
import { createGuardPath } from './support/guard-path.js';
import { type Decide, type DecisionsMeasured, measureDecisions } from './support/measure-decisions.js';

const QUICK = process.env.QUICK === '1';
const IN_FLIGHT = [1, 16, 128] as const;
/** Decisions per measurement, and a bound in time whichever comes first. */
const CALLS = QUICK ? 5_000 : 20_000;
const MAX_MS = 4_000;
const ROUNDS = QUICK ? 1 : 3;
const WARM_UP = QUICK ? 2_000 : 5_000;
const HUGE = 1_000_000_000;
const KEYS_FOR_MEMORY = 10_000;

/** The floor: a fixed window in one script, INCR and PEXPIRE atomically. */
const FLOOR_LUA = `
local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return count`;

type Result = DecisionsMeasured;

/** Runs `CALLS` decisions with `inFlight` outstanding at once, over `keys` keys in turn (`MAX_MS` at most). */
function measure(client: Redis, decide: Decide, inFlight: number, keys: number): Promise<Result> {
  return measureDecisions(client, decide, { inFlight, keys, calls: CALLS, maxMs: MAX_MS });
}

function median(results: Result[]): Result {
  const sorted = [...results].sort((a, b) => a.perSecond - b.perSecond);
  return sorted[Math.floor(sorted.length / 2)];
}

/** A refused decision of rate-limiter-flexible rejects its promise; a refusal is an answer here. */
const settled = (promise: Promise<unknown>) =>
  promise.catch((error: unknown) => {
    if (!(error instanceof RateLimiterRes)) throw error;
  });

async function main(): Promise<void> {
  const server = await startRedisServer(REDIS_MEMORY_ARGS);
  const client = new Redis(server.url);
  const floorSha = String(await client.script('LOAD', FLOOR_LUA));
  const rlf = (points: number, block: boolean, prefix: string) =>
    new RateLimiterRedis({
      storeClient: client,
      points,
      duration: 60,
      keyPrefix: prefix,
      ...(block ? { inMemoryBlockOnConsumed: points, inMemoryBlockDuration: 60 } : {}),
    });
  const flexible = rlf(HUGE, false, 'rlf');
  const flexibleAttack = rlf(5, false, 'rlfa');
  const flexibleAttackBlock = rlf(5, true, 'rlfb');
  const flexibleThree = [rlf(HUGE, false, 'rlf1'), rlf(HUGE, false, 'rlf2'), rlf(HUGE, false, 'rlf3')];
  const { store, limiter, close } = await createStore({ redis: server.url });
  // The same with Prometheus metrics on, in a registry of its own: their cost per decision.
  const metered = await createStore({
    redis: server.url,
    extensions: [rateLimitMetrics({ registry: new Registry() })],
  });
  const rule = { name: 'bench', count: HUGE, window: '1m' } as const;
  const attackRule = { name: 'attack', count: 5, window: '1m' } as const;
  const globalRule = { name: 'global', count: HUGE, window: '1m', by: 'global' } as const;
  const threeRules = [
    rule,
    { name: 'bench2', count: HUGE, window: '1h' },
    { name: 'bench3', count: HUGE, window: '1d' },
  ];
  // The same rules on controller methods, decided through the guard as Nest calls it for a request.
  const guardPath = await createGuardPath(server.url, { bench: [rule], attack: [attackRule], three: threeRules });

  const admitting: Record<string, Decide> = {
    'one-EVALSHA floor': (key) => client.evalsha(floorSha, 1, `floor:{${key}}`, 60_000),
    'rate-limiter-flexible': (key) => settled(flexible.consume(String(key))),
    'ours: store call': (key) => store.consume([hit(`rl:{${key}}:bench:fw`, { limit: HUGE, windowMs: 60_000 })]),
    'ours: RateLimiterService.consume': (key) => limiter.consume(rule, String(key)),
    'ours: guard path': (key) => guardPath.decide('bench', key),
    'ours: consume, metrics on': (key) => metered.limiter.consume(rule, String(key)),
  };
  const attack: Record<string, Decide> = {
    'one-EVALSHA floor': () => client.evalsha(floorSha, 1, 'floor:{attack}', 60_000),
    'rate-limiter-flexible': () => settled(flexibleAttack.consume('attack')),
    'rate-limiter-flexible, in-memory block': () => settled(flexibleAttackBlock.consume('attack')),
    'ours: RateLimiterService.consume': () => limiter.consume(attackRule, 'attack'),
    'ours: guard path': () => guardPath.decide('attack', 0),
    'ours: consume, metrics on': () => metered.limiter.consume(attackRule, 'attack'),
  };
  const three: Record<string, Decide> = {
    'one-EVALSHA floor': (key) => client.evalsha(floorSha, 1, `floor:{${key}}`, 60_000),
    'rate-limiter-flexible, 3 limiters': (key) =>
      Promise.all(flexibleThree.map((limiterOfRule) => settled(limiterOfRule.consume(String(key))))),
    'ours: 1 rule': (key) => limiter.consume(rule, String(key)),
    'ours: 3 rules': (key) => limiter.consume(threeRules, String(key)),
    'ours: guard path, 1 rule': (key) => guardPath.decide('bench', key),
    'ours: guard path, 3 rules': (key) => guardPath.decide('three', key),
  };

  const hot: Record<string, Decide> = {
    'one-EVALSHA floor': () => client.evalsha(floorSha, 1, 'floor:{global}', 60_000),
    'rate-limiter-flexible': () => settled(flexible.consume('global')),
    'ours: no lease': () => limiter.consume(globalRule, 'any'),
  };
  // Rules given as options are validated once per object: one object each.
  for (const [name, lease] of [
    ['ours: lease 100', 100],
    ['ours: lease 1,000', 1_000],
  ] as const) {
    const leased = { ...globalRule, name: `global${lease}`, lease };
    hot[name] = () => limiter.consume(leased, 'any');
  }

  try {
    for (const contenders of [admitting, attack, three, hot]) {
      for (const decide of Object.values(contenders)) {
        for (let i = 0; i < WARM_UP; i += 16) await Promise.all(Array.from({ length: 16 }, (_, j) => decide(i + j)));
      }
    }

    const run = async (
      title: string,
      contenders: Record<string, Decide>,
      cells: { keys: number; keysName: string; inFlight: number }[],
    ) => {
      const names = Object.keys(contenders);
      const results = new Map<string, Result[]>();
      for (let round = 0; round < ROUNDS; round += 1) {
        const order = round % 2 === 0 ? names : [...names].reverse();
        for (const cell of cells) {
          for (const name of order) {
            const id = `${name}|${cell.keysName}|${cell.inFlight}`;
            const result = await measure(client, contenders[name], cell.inFlight, cell.keys);
            results.set(id, [...(results.get(id) ?? []), result]);
          }
        }
      }
      const rows = [
        `### ${title}`,
        '',
        '| contender | keys | in flight | decisions/s | x floor | p99 ms | Node µs/decision | Redis µs/decision |',
        '|---|---|---|---|---|---|---|---|',
      ];
      for (const cell of cells) {
        const floor = median(results.get(`${names[0]}|${cell.keysName}|${cell.inFlight}`)!);
        for (const name of names) {
          const r = median(results.get(`${name}|${cell.keysName}|${cell.inFlight}`)!);
          rows.push(
            `| ${name} | ${cell.keysName} | ${cell.inFlight} | ${Math.round(r.perSecond)} | ` +
              `${(r.perSecond / floor.perSecond).toFixed(2)} | ${r.p99Ms.toFixed(2)} | ${r.nodeUs.toFixed(1)} | ${r.redisUs.toFixed(1)} |`,
          );
        }
      }
      console.log(rows.join('\n'), '\n');
      return { names, cells, results };
    };

    const grid = [
      ...IN_FLIGHT.map((inFlight) => ({ keys: 1, keysName: 'hot', inFlight })),
      ...IN_FLIGHT.map((inFlight) => ({ keys: 10_000, keysName: '10k keys', inFlight })),
    ];
    await run('Admitting: one fixed-window rule, a limit no call reaches', admitting, grid);
    await run('Attack: one hot key over its limit (5 a minute)', attack, [
      { keys: 1, keysName: 'hot', inFlight: 16 },
      { keys: 1, keysName: 'hot', inFlight: 128 },
    ]);
    await run('Three rules on one decision, 10,000 keys', three, [
      { keys: 10_000, keysName: '10k keys', inFlight: 16 },
      { keys: 10_000, keysName: '10k keys', inFlight: 128 },
    ]);

    const hotCells = [16, 128].map((inFlight) => ({ keys: 1, keysName: 'hot', inFlight }));
    const hotRun = await run('Hot global key: one counter for every decision', hot, hotCells);
    // One key lives on one shard, whose one core is the ceiling of every decision that asks it.
    const ceilings = [
      '### Hot global key: the rate at which it would take all of one Redis core (1 s / Redis µs per decision)',
      '',
      '| contender | in flight | Redis-bound ceiling, decisions/s |',
      '|---|---|---|',
    ];
    for (const cell of hotCells) {
      for (const name of hotRun.names) {
        const r = median(hotRun.results.get(`${name}|${cell.keysName}|${cell.inFlight}`)!);
        const ceiling = r.redisUs > 0 ? Math.round(1e6 / r.redisUs).toLocaleString('en') : 'unbounded';
        ceilings.push(`| ${name} | ${cell.inFlight} | ${ceiling} |`);
      }
    }
    console.log(ceilings.join('\n'), '\n');

    // Redis memory per fixed-window key, from used_memory over 10,000 fresh keys, settled, median of 3.
    const perKey = (write: (key: number) => Promise<unknown>) =>
      redisBytesPerKey(client, write, { keys: KEYS_FOR_MEMORY });
    // A rule named by default (`Controller.method`) is in its keys by a digest of its name.
    const defaultNamed = { ...rule, name: 'PingController.ping' };
    const memory = [
      '### Redis memory per fixed-window key (used_memory over 10,000 keys)',
      '',
      '| contender | bytes per key |',
      '|---|---|',
      `| one-EVALSHA floor (\`floor:{n}\`) | ${(await perKey(admitting['one-EVALSHA floor'])).toFixed(0)} |`,
      `| rate-limiter-flexible (\`rlf:n\`) | ${(await perKey(admitting['rate-limiter-flexible'])).toFixed(0)} |`,
      `| ours (\`rl:{n}:bench:fw\`) | ${(await perKey((key) => limiter.consume(rule, String(key)))).toFixed(0)} |`,
      `| ours, rule ${defaultNamed.name} (\`rl:{n}:${ruleKeyId(defaultNamed.name)}:fw\`) | ${(await perKey((key) => limiter.consume(defaultNamed, String(key)))).toFixed(0)} |`,
    ];
    console.log(memory.join('\n'), '\n');

    // Our algorithms: Redis CPU per decision and memory per key, 10,000 keys at 16 in flight.
    const algorithmRows = [
      '### Our algorithms on Redis: 10,000 keys, 16 in flight',
      '',
      '| algorithm | decisions/s | Redis µs/decision | Redis bytes per key |',
      '|---|---|---|---|',
    ];
    for (const algorithm of ALGORITHM_NAMES as readonly RateLimitAlgorithmName[]) {
      const algorithmRule = { name: `alg-${algorithm}`, count: HUGE, window: '1m', algorithm } as const;
      const decide: Decide = (key) => limiter.consume(algorithmRule, String(key));
      const bytes = await perKey(decide);
      const results: Result[] = [];
      for (let round = 0; round < ROUNDS; round += 1) results.push(await measure(client, decide, 16, 10_000));
      const r = median(results);
      algorithmRows.push(
        `| ${algorithm} | ${Math.round(r.perSecond)} | ${r.redisUs.toFixed(1)} | ${bytes.toFixed(0)} |`,
      );
    }
    console.log(algorithmRows.join('\n'), '\n');
  } finally {
    await close();
    await metered.close();
    await guardPath.close();
    client.disconnect();
    await server.stop();
  }
  await embedded();
}

/**
 * The embedded store (no Redis), in this process: the store call and the whole decision on one hot
 * key and on 100,000 keys, with `memoryStore.maxKeys` sized to hold them; then a flood of
 * 1,000,000 distinct keys through a store of 100,000, to show its memory stays bounded.
 */
async function embedded(): Promise<void> {
  const DISTINCT = 100_000;
  const DECISIONS = QUICK ? 300_000 : 1_000_000;
  const { store, limiter, close } = await createStore({ memoryStore: { maxKeys: 2 * DISTINCT } });
  const rows = [
    '### Embedded store (no Redis): decisions/s in one process',
    '',
    '| call | keys | decisions/s | µs/decision |',
    '|---|---|---|---|',
  ];
  try {
    const hot = [hit('rl:{hot}:bench:fw', { limit: HUGE, windowMs: 60_000 })];
    const many = Array.from({ length: DISTINCT }, (_, i) => [
      hit(`rl:{${i}}:bench:fw`, { limit: HUGE, windowMs: 60_000 }),
    ]);
    const identities = Array.from({ length: DISTINCT }, (_, i) => String(i));
    const rule = { name: 'embedded', count: HUGE, window: '1m' } as const;
    const cases: [string, string, (i: number) => Promise<unknown>][] = [
      ['store call', 'hot', () => store.consume(hot)],
      ['store call', '100k keys', (i) => store.consume(many[i % DISTINCT])],
      ['RateLimiterService.consume', 'hot', () => limiter.consume(rule, 'hot')],
      ['RateLimiterService.consume', '100k keys', (i) => limiter.consume(rule, identities[i % DISTINCT])],
    ];
    for (const [call, keys, decide] of cases) {
      const perSecond: number[] = [];
      for (let round = 0; round < ROUNDS + 1; round += 1) {
        const started = performance.now();
        let n = 0;
        while (n < DECISIONS && performance.now() - started < MAX_MS) {
          for (const end = n + 1_000; n < end; n += 1) await decide(n);
        }
        // The first round warms up (and fills the 100,000 keys).
        if (round > 0) perSecond.push((n / (performance.now() - started)) * 1000);
      }
      const rate = perSecond.sort((a, b) => a - b)[Math.floor(perSecond.length / 2)];
      rows.push(`| ${call} | ${keys} | ${Math.round(rate)} | ${(1e6 / rate).toFixed(2)} |`);
    }
  } finally {
    await close();
  }
  console.log(rows.join('\n'), '\n');

  const bounded = await createStore({ memoryStore: { maxKeys: DISTINCT } });
  try {
    global.gc?.();
    const before = process.memoryUsage().heapUsed;
    const flood = 10 * DISTINCT;
    for (let i = 0; i < flood; i += 1) {
      await bounded.store.consume([hit(`rl:{flood${i}}:bench:fw`, { limit: 5, windowMs: 60_000 })]);
    }
    global.gc?.();
    const after = process.memoryUsage().heapUsed;
    console.log(
      `Flood: ${flood.toLocaleString('en')} distinct keys through a store of maxKeys ${DISTINCT.toLocaleString('en')}: ` +
        `heap ${((after - before) / 2 ** 20).toFixed(0)} MiB more after it (${((after - before) / DISTINCT).toFixed(0)} B per key held)` +
        `${global.gc ? '' : ' (run with node --expose-gc for a figure after collection)'}`,
    );
  } finally {
    await bounded.close();
  }
}

await main();

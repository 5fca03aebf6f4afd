/**
 * A long run at a steady load near saturation, with identities churning, on Redis and on the
 * embedded store at once (each with its own decisions in flight, in this process): what grows?
 *
 * Every 10 s it samples this process's RSS and heap, its timers, sockets and other handles
 * (`process.getActiveResourcesInfo()`), Redis's `used_memory`, key count and connected clients,
 * and each store's p99 over the interval. At the end it prints the samples and each series' slope
 * (a least-squares line over the samples after the first two minutes, as a change per 10 minutes):
 * flat is what a limiter must be; a leak shows as a steady slope, a GC pause or pool exhaustion as
 * p99 steps.
 *
 * Load: an identity drawn from 1,000 active ones, the active set moving on so that 100,000
 * distinct identities pass over the run, each leaving its keys to expire. Every decision is on two
 * generous rules per identity (a fixed window of 60,000 a minute and a token bucket of 1,000 a
 * second), so nearly every decision is a Redis call, and on one global counter leased 1,000 units
 * at a time; every tenth identity also on a strict fixed window of 60 a minute, so its refusals
 * exercise the block cache.
 *
 * The heap is sampled after a full collection (`node --expose-gc`), so it is what is still held.
 *
 *   npm run bench:soak              (SOAK_MINUTES=20 by default; SOAK_MINUTES=2 for a short look)
 */
import { Redis } from 'ioredis';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore } from '../test/support/store-module.js';

const MINUTES = Number(process.env.SOAK_MINUTES ?? 20);
const SAMPLE_MS = 10_000;
const IN_FLIGHT = 16;
const ACTIVE = 1_000;
const DISTINCT = 100_000;
const WARM_UP_MS = Math.min(120_000, (MINUTES * 60_000) / 5);

const RULES = [
  { name: 'soak-window', count: 60_000, window: '1m' },
  { name: 'soak-bucket', count: 1_000, window: '1s', algorithm: 'token-bucket', burst: 2_000 },
  // One counter for every decision, leased: most decisions take their unit from this instance.
  { name: 'soak-global', count: 100_000_000, window: '1m', by: 'global', lease: 1_000 },
] as const;
const STRICT_RULES = [...RULES, { name: 'soak-strict', count: 60, window: '1m' }] as const;

interface Sample {
  atMs: number;
  rssMiB: number;
  heapMiB: number;
  handles: number;
  timers: number;
  redisMemoryMiB: number;
  redisKeys: number;
  redisClients: number;
  redisP99Ms: number;
  memoryP99Ms: number;
  redisPerSecond: number;
  memoryPerSecond: number;
}

const server = await startRedisServer();
const stats = new Redis(server.url);
const onRedis = await createStore({ redis: server.url });
const embedded = await createStore({ memoryStore: { maxKeys: 20_000 } });
const started = performance.now();
const endAt = started + MINUTES * 60_000;

/** The next decision's identity: one of ACTIVE, the set moving on so DISTINCT pass in all. */
function nextIdentity(): number {
  const progress = (performance.now() - started) / (endAt - started);
  return Math.floor(progress * (DISTINCT - ACTIVE)) + Math.floor(Math.random() * ACTIVE);
}

/**
 * Latencies of one interval in fixed memory: counts per bucket 5% wide, from 1 µs up (the load's
 * own memory must not grow, or it would hide what the limiter's does).
 */
class LatencyHistogram {
  private readonly counts = new Float64Array(500);
  private n = 0;
  add(ms: number): void {
    const bucket = Math.min(499, Math.max(0, Math.ceil(Math.log(Math.max(ms * 1000, 1)) / Math.log(1.05))));
    this.counts[bucket] += 1;
    this.n += 1;
  }
  /** The interval's p99 in ms (a bucket's upper edge), and a fresh interval. */
  takeP99(): number {
    let seen = 0;
    let p99 = 0;
    for (let bucket = 0; bucket < this.counts.length; bucket += 1) {
      seen += this.counts[bucket];
      if (seen >= this.n * 0.99) {
        p99 = 1.05 ** bucket / 1000;
        break;
      }
    }
    this.counts.fill(0);
    this.n = 0;
    return p99;
  }
}

const latencies = { redis: new LatencyHistogram(), memory: new LatencyHistogram() };
const decisions = { redis: 0, memory: 0 };

/**
 * One of the store's decisions in flight, one after another. The embedded store answers at once,
 * so its loops give the event loop a turn after each decision, as requests arriving over sockets
 * would: else they would starve the Redis loops and the sampler.
 */
async function load(store: 'redis' | 'memory', limiter: typeof onRedis.limiter): Promise<void> {
  const into = latencies[store];
  while (performance.now() < endAt) {
    const at = performance.now();
    const identity = nextIdentity();
    await limiter.consume(identity % 10 === 0 ? STRICT_RULES : RULES, `user-${identity}`);
    into.add(performance.now() - at);
    decisions[store] += 1;
    if (store === 'memory') await new Promise((resolve) => setImmediate(resolve));
  }
}

const field = (info: string, name: string) => Number(new RegExp(`${name}:(\\d+)`).exec(info)?.[1] ?? 0);

const samples: Sample[] = [];
let last = { ...decisions };
const sampler = setInterval(() => {
  void (async () => {
    // Only while the load runs: not the loops winding down.
    if (performance.now() >= endAt) return;
    // After a full collection, the heap is what is still held: a sawtooth hides a slow leak.
    global.gc?.();
    const memory = process.memoryUsage();
    const resources = process.getActiveResourcesInfo();
    const info = await stats.info();
    samples.push({
      atMs: performance.now() - started,
      rssMiB: memory.rss / 2 ** 20,
      heapMiB: memory.heapUsed / 2 ** 20,
      handles: resources.length,
      timers: resources.filter((type) => type === 'Timeout').length,
      redisMemoryMiB: field(info, 'used_memory') / 2 ** 20,
      redisKeys: await stats.dbsize(),
      // Less this sampler's own connection.
      redisClients: field(info, 'connected_clients') - 1,
      redisP99Ms: latencies.redis.takeP99(),
      memoryP99Ms: latencies.memory.takeP99(),
      redisPerSecond: ((decisions.redis - last.redis) * 1000) / SAMPLE_MS,
      memoryPerSecond: ((decisions.memory - last.memory) * 1000) / SAMPLE_MS,
    });
    last = { ...decisions };
    const s = samples.at(-1)!;
    process.stderr.write(
      `${(s.atMs / 60_000).toFixed(1)} min: ${Math.round(s.redisPerSecond)} + ${Math.round(s.memoryPerSecond)}/s, rss ${s.rssMiB.toFixed(0)} MiB, ` +
        `Redis ${s.redisKeys} keys, p99 ${s.redisP99Ms.toFixed(2)} / ${s.memoryP99Ms.toFixed(2)} ms\n`,
    );
  })();
}, SAMPLE_MS);

try {
  await Promise.all([
    ...Array.from({ length: IN_FLIGHT }, () => load('redis', onRedis.limiter)),
    ...Array.from({ length: IN_FLIGHT }, () => load('memory', embedded.limiter)),
  ]);
} finally {
  clearInterval(sampler);
  await onRedis.close();
  await embedded.close();
  stats.disconnect();
  await server.stop();
}

/** Least-squares slope of a series over the samples after the warm-up, per 10 minutes. */
function slopePer10Min(pick: (s: Sample) => number): { mean: number; slope: number } {
  const steady = samples.filter((s) => s.atMs >= WARM_UP_MS);
  const n = steady.length;
  const xs = steady.map((s) => s.atMs / 600_000);
  const ys = steady.map(pick);
  const mx = xs.reduce((a, b) => a + b, 0) / n;
  const my = ys.reduce((a, b) => a + b, 0) / n;
  const sxy = xs.reduce((sum, x, i) => sum + (x - mx) * (ys[i] - my), 0);
  const sxx = xs.reduce((sum, x) => sum + (x - mx) ** 2, 0);
  return { mean: my, slope: sxx === 0 ? 0 : sxy / sxx };
}

const series: [string, (s: Sample) => number, number][] = [
  ['decisions/s, Redis store', (s) => s.redisPerSecond, 0],
  ['decisions/s, embedded store', (s) => s.memoryPerSecond, 0],
  ['RSS MiB', (s) => s.rssMiB, 1],
  ['heap used MiB', (s) => s.heapMiB, 1],
  ['active handles', (s) => s.handles, 1],
  ['of which timers', (s) => s.timers, 1],
  ['Redis used_memory MiB', (s) => s.redisMemoryMiB, 2],
  ['Redis keys', (s) => s.redisKeys, 0],
  ['Redis clients (the library)', (s) => s.redisClients, 1],
  ['p99 ms, Redis store', (s) => s.redisP99Ms, 2],
  ['p99 ms, embedded store', (s) => s.memoryP99Ms, 3],
];
console.log(
  `### Soak: ${MINUTES} min, ${IN_FLIGHT} decisions in flight per store, ${DISTINCT.toLocaleString('en')} identities ` +
    `(${ACTIVE} active at a time), node ${process.version}\n`,
);
console.log(`Slopes over the samples after the first ${WARM_UP_MS / 60_000} min, per 10 min:\n`);
console.log('| series | first | last | mean | slope per 10 min | slope / mean |');
console.log('|---|---|---|---|---|---|');
for (const [name, pick, digits] of series) {
  const { mean, slope } = slopePer10Min(pick);
  const steady = samples.filter((s) => s.atMs >= WARM_UP_MS);
  console.log(
    `| ${name} | ${pick(steady[0]).toFixed(digits)} | ${pick(steady.at(-1)!).toFixed(digits)} | ${mean.toFixed(digits)} | ` +
      `${slope >= 0 ? '+' : ''}${slope.toFixed(Math.max(digits, 2))} | ${mean === 0 ? '-' : `${((100 * slope) / mean).toFixed(1)}%`} |`,
  );
}

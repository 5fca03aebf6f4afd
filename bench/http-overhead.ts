/**
 * What the limiter costs per request, measured over HTTP against the built demo app.
 *
 *   npm run bench:http           # 10 s per scenario; BENCH_SECONDS=30 npm run bench:http for longer
 *
 * The demo runs in its own process (one core), autocannon in this one (the other core); Redis is a
 * redis-server this script starts on a free loopback port. Scenarios, each after a 2 s warm-up:
 * - GET /health: exempt (@SkipRateLimit), the app without the limiter's work;
 * - GET /ping with the embedded store, and with Redis; the limit is set far above the load
 *   (RATE_LIMIT_DEMO_PING_COUNT) so every request is admitted and pays the full path.
 * It also reads Redis's INFO commandstats to show the round trips per request.
 */
import autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { startRedisServer } from '../test/support/redis-server.js';
import { startDemo } from './support/demo-process.js';

const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 50);

interface Row {
  scenario: string;
  requestsPerSecond: number;
  p50: number;
  p99: number;
  errors: number;
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  let roundTrips = '';
  const redis = await startRedisServer();
  const stats = new Redis(redis.port, '127.0.0.1');
  try {
    const memoryDemo = await startDemo({});
    try {
      rows.push(await load('GET /health (exempt), no limiter work', `${memoryDemo.url}/health`));
      rows.push(await load('GET /ping, embedded memory store', `${memoryDemo.url}/ping`));
    } finally {
      await memoryDemo.stop();
    }

    const redisDemo = await startDemo({ REDIS_URL: redis.url });
    try {
      await stats.config('RESETSTAT');
      const row = await load('GET /ping, Redis store', `${redisDemo.url}/ping`);
      rows.push(row);
      const info = await stats.info('commandstats');
      const calls = (command: string) => Number(new RegExp(`cmdstat_${command}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
      roundTrips = `Redis round trips: ${calls('evalsha') + calls('eval')} script calls (EVALSHA ${calls('evalsha')}, EVAL ${calls('eval')}) for ${row.requestsTotal} requests, warm-up included`;
    } finally {
      await redisDemo.stop();
    }
  } finally {
    stats.disconnect();
    await redis.stop();
  }

  console.log(`\n${roundTrips}`);
  console.log(`${CONNECTIONS} connections, ${SECONDS} s per scenario, node ${process.version}\n`);
  console.log('| scenario | req/s | p50 ms | p99 ms | non-2xx or errors |');
  console.log('|---|---:|---:|---:|---:|');
  for (const row of rows) {
    console.log(`| ${row.scenario} | ${row.requestsPerSecond.toFixed(0)} | ${row.p50} | ${row.p99} | ${row.errors} |`);
  }
}

async function load(scenario: string, url: string): Promise<Row & { requestsTotal: number }> {
  const warmUp = await autocannon({ url, connections: CONNECTIONS, duration: 2 });
  const result = await autocannon({ url, connections: CONNECTIONS, duration: SECONDS });
  return {
    scenario,
    requestsPerSecond: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    errors: result.non2xx + result.errors + result.timeouts,
    requestsTotal: warmUp.requests.total + result.requests.total,
  };
}

await main();

/**
 * Latency and decisions while Redis is paused, then killed and restarted, under steady traffic.
 *
 *   npm run bench:outage
 *
 * Builds the demo, runs it on its own process against a redis-server this script starts (deadline
 * 100 ms, circuit breaker and 'local' fallback at their defaults), and drives GET /ping (limit set
 * far above the load) from 8 sequential clients. Phases of 3 s: normal; Redis paused (SIGSTOP);
 * resumed; killed (SIGKILL) and restarted after 1 s. Reports per phase the latency percentiles,
 * failures, the share of requests Redis decided, and how long after Redis returned the first
 * request was decided by Redis again.
 */
import { type RedisServer, startRedisServer } from '../test/support/redis-server.js';
import { startDemo } from './support/demo-process.js';

const PHASE_MS = 3_000;
const CLIENTS = 8;

interface Sample {
  at: number;
  ms: number;
  status: number;
  fromRedis: boolean;
}

async function main(): Promise<void> {
  let redis: RedisServer = await startRedisServer();
  const demo = await startDemo({ REDIS_URL: redis.url });
  const rows: string[] = [];
  try {
    const phase = async (name: string, during?: () => Promise<void>) => {
      const started = performance.now();
      const traffic = drive(demo.url, PHASE_MS);
      await during?.();
      const samples = await traffic;
      rows.push(describe(name, samples, started));
    };
    await phase('normal');
    process.kill(redis.pid, 'SIGSTOP');
    await phase('Redis paused (SIGSTOP)');
    process.kill(redis.pid, 'SIGCONT');
    await phase('Redis resumed');
    await phase('Redis killed, restarted after 1 s', async () => {
      const crashed = redis;
      await crashed.kill();
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      redis = await startRedisServer([], crashed.port);
      await crashed.stop();
    });
    await phase('after the restart');
  } finally {
    await demo.stop();
    await redis.stop();
  }
  console.log(`\n${CLIENTS} sequential clients, ${PHASE_MS / 1000} s per phase, node ${process.version}\n`);
  console.log('| phase | requests | p50 ms | p99 ms | max ms | 5xx | decided by Redis | first Redis decision |');
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
  for (const row of rows) console.log(row);
}

async function drive(base: string, durationMs: number): Promise<Sample[]> {
  const samples: Sample[] = [];
  const until = performance.now() + durationMs;
  const client = async () => {
    for (let i = 0; i < 100_000 && performance.now() < until; i += 1) {
      const at = performance.now();
      const response = await fetch(`${base}/ping`);
      await response.arrayBuffer();
      samples.push({
        at,
        ms: performance.now() - at,
        status: response.status,
        fromRedis: response.headers.has('ratelimit-limit'),
      });
    }
  };
  await Promise.all(Array.from({ length: CLIENTS }, client));
  return samples;
}

function describe(name: string, samples: Sample[], started: number): string {
  const sorted = samples.map((s) => s.ms).sort((a, b) => a - b);
  const pct = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))].toFixed(1);
  const fromRedis = samples.filter((s) => s.fromRedis);
  const firstRedis = fromRedis.length
    ? `+${(Math.min(...fromRedis.map((s) => s.at)) - started).toFixed(0)} ms`
    : 'none';
  const errors = samples.filter((s) => s.status >= 500).length;
  const share = ((100 * fromRedis.length) / samples.length).toFixed(0);
  return `| ${name} | ${samples.length} | ${pct(50)} | ${pct(99)} | ${sorted.at(-1)!.toFixed(1)} | ${errors} | ${share}% | ${firstRedis} |`;
}

await main();

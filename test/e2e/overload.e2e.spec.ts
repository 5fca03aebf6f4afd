import { Agent, request } from 'node:http';
import { setPriority } from 'node:os';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DemoProcess, startDemoProcess } from '../support/demo-process.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';
import { type Answer, burst } from '../support/traffic.js';

/**
 * The incident: three instances on one idle Redis, bursts of 200 concurrent requests, event loops
 * stalled 210-257 ms under the load. The 100 ms deadline ran before the reply that had already
 * arrived was read, the circuit opened, and the 'local' fallback admitted up to 11 for a limit of 5.
 * Here the built demo runs three times, each with a preload that stalls its event loop while
 * requests come in. Redis answers every call within microseconds, so every burst must be decided by
 * Redis alone: exactly the limit admitted, the rest refused, and no fallback decision logged.
 */

const PRELOAD = new URL('../support/event-loop-staller.mjs', import.meta.url).href;
const INSTANCES = 3;
const BURSTS_PER_ROUTE = 100;
const BURST_SIZE = 200;
/** /ip and /multi's 'multi-client' rule: 5 per 10 s per client address. */
const LIMIT = 5;
/** Well past the 100 ms deadline, as in the incident. */
const STALL_MS = 250;
/**
 * After a stall, the requests queued meanwhile are served this long before a request can start
 * the next one; under steady load a stall every 300 ms. Longer gaps mean fewer stalls per burst
 * (a shorter run); 50 ms still stalls most instances in most bursts.
 */
const STALL_GAP_MS = 50;

/** The built demo with the staller preloaded, on a free loopback port. */
function startStalledDemo(env: Record<string, string>, started: DemoProcess[]): Promise<DemoProcess> {
  return startDemoProcess(
    { ...env, EVENT_LOOP_STALL_MS: String(STALL_MS), EVENT_LOOP_STALL_GAP_MS: String(STALL_GAP_MS) },
    started,
    ['--import', PRELOAD],
  );
}

/** One GET through the shared keep-alive agent; resolves once the body is read. */
function get(agent: Agent, url: string, clientAddress: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent, headers: { 'x-forwarded-for': clientAddress } }, (res) => {
      res.resume();
      res.once('end', () => resolve({ status: res.statusCode!, headers: res.headers }));
      res.once('error', reject);
    });
    req.once('error', reject);
    req.end();
  });
}

/** `BURST_SIZE` concurrent requests from one client address, spread over the instances: count per status. */
async function burstOver(
  agent: Agent,
  demos: readonly DemoProcess[],
  path: string,
  clientAddress: string,
): Promise<Map<number, number>> {
  const { statuses } = await burst(BURST_SIZE, (i) =>
    get(agent, `${demos[i % demos.length].url}${path}`, clientAddress),
  );
  const counts = new Map<number, number>();
  for (const status of statuses) counts.set(status, (counts.get(status) ?? 0) + 1);
  return counts;
}

/** What the staller writes on SIGTERM (`STALLS {...}`). */
interface StallReport {
  stallsMs: number[];
  loopDelay: { p50Ms: number; p99Ms: number; maxMs: number };
}

function stallReport(output: string): StallReport | undefined {
  const line = output.split('\n').find((l) => l.startsWith('STALLS '));
  return line ? (JSON.parse(line.slice('STALLS '.length)) as StallReport) : undefined;
}

/** `min / median / max` of some figures. */
function spread(values: readonly number[]): string {
  const sorted = [...values].sort((a, b) => a - b);
  return `min ${sorted[0]} / median ${sorted[Math.floor(sorted.length / 2)]} / max ${sorted.at(-1)}`;
}

function describeStalls(report: StallReport | undefined): string {
  if (!report) return 'no STALLS line';
  const { loopDelay } = report;
  return (
    `${report.stallsMs.length} stalls, ${spread(report.stallsMs)} ms; ` +
    `event-loop delay p50 ${loopDelay.p50Ms} / p99 ${loopDelay.p99Ms} / max ${loopDelay.maxMs} ms`
  );
}

/** `{admitted: bursts}`, e.g. `{"5":100}`. */
function histogram(admitted: readonly number[]): Record<number, number> {
  const counts: Record<number, number> = {};
  for (const n of admitted) counts[n] = (counts[n] ?? 0) + 1;
  return counts;
}

/** The bursts that admitted other than `LIMIT`, as `route#burst:admitted`, the first 20 of them. */
function describeOffLimit(byRoute: Record<string, readonly number[]>): string {
  const off = Object.entries(byRoute).flatMap(([route, admitted]) =>
    admitted.flatMap((n, i) => (n === LIMIT ? [] : [`${route}#${i}:${n}`])),
  );
  if (off.length === 0) return 'none';
  return `${off.length}: ${off.slice(0, 20).join(' ')}${off.length > 20 ? ` …and ${off.length - 20} more` : ''}`;
}

/** Sums the sampled store-failure lines (`Rate-limit store failed (Class: …): N since last report`) by error. */
function failuresByError(lines: readonly string[]): Record<string, number> {
  const sums: Record<string, number> = {};
  for (const line of lines) {
    const match = /Rate-limit store failed \((?:(\w+):|\d+ keys).*: (\d+) since last report/.exec(line);
    const error = match?.[1] ?? 'keys past the line cap';
    if (match) sums[error] = (sums[error] ?? 0) + Number(match[2]);
  }
  return sums;
}

describe('three instances with stalled event loops on one idle Redis', () => {
  let server: RedisServer | undefined;
  let redis: Redis;
  const demos: DemoProcess[] = [];
  const agent = new Agent({ keepAlive: true, maxSockets: BURST_SIZE });

  beforeAll(async () => {
    server = await startRedisServer();
    // What is asserted holds while Redis answers. On a machine whose cores other work keeps busy,
    // the test's Redis gets the CPU first (as root; elsewhere it keeps its priority): the app
    // processes are the ones meant to stall, not the server they are measured against.
    try {
      setPriority(server.pid, -10);
    } catch {
      // Not permitted: the test still runs, on an unloaded machine as well as before.
    }
    redis = server.client();
    const env = { REDIS_URL: server.url, TRUST_PROXY: '1', RATE_LIMIT_PREFIX: uniquePrefix() };
    await Promise.all(Array.from({ length: INSTANCES }, () => startStalledDemo(env, demos)));
  }, 120_000);

  afterAll(async () => {
    agent.destroy();
    await Promise.all(demos.map((demo) => demo.stop()));
    await server?.stop();
  });

  it('admits exactly the limit in every burst, decided by Redis alone', { timeout: 180_000 }, async () => {
    const started = performance.now();
    const admitted: Record<'/ip' | '/multi', number[]> = { '/ip': [], '/multi': [] };
    const unexpected: string[] = [];
    const roundsMs: number[] = [];
    for (let i = 0; i < BURSTS_PER_ROUTE; i += 1) {
      const roundStarted = performance.now();
      // /multi also counts every client on one global 'multi-route' counter (50 per 10 s), which
      // would refuse the bursts after the tenth. Emptying the test's own Redis before each round
      // gives every burst a fresh one, without knowing the demo's key layout or waiting out windows.
      // The instances' lost-write check does not take the flush for writes lost in a failover: it
      // compares windows by their start on Redis's clock, and the new one starts later.
      await redis.flushdb();
      // A /ip and a /multi burst at once, each from a client address of its own (documentation
      // ranges), halve the run; the instances see 400 concurrent requests: more load, not less.
      const [ipCounts, multiCounts] = await Promise.all([
        burstOver(agent, demos, '/ip', `198.51.100.${i + 1}`),
        burstOver(agent, demos, '/multi', `203.0.113.${i + 1}`),
      ]);
      for (const [route, counts] of [
        ['/ip', ipCounts],
        ['/multi', multiCounts],
      ] as const) {
        admitted[route].push(counts.get(200) ?? 0);
        if ((counts.get(200) ?? 0) + (counts.get(429) ?? 0) !== BURST_SIZE) {
          unexpected.push(`${route} burst ${i}: ${JSON.stringify(Object.fromEntries(counts))}`);
        }
      }
      roundsMs.push(Math.round(performance.now() - roundStarted));
    }
    const elapsedS = ((performance.now() - started) / 1000).toFixed(1);

    // Stopped here, not only in afterAll: the staller reports on SIGTERM, and the library flushes
    // its sampled log lines on shutdown.
    await Promise.all(demos.map((demo) => demo.stop()));
    const outputs = demos.map((demo) => demo.output());
    const reports = outputs.map(stallReport);
    // Any circuit transition line (open, half-open, closed, or their sampled summary) means it opened;
    // a lost-write line, that a decision was taken on a figure other than Redis's.
    const fallbackLines = outputs.flatMap((output, i) =>
      output
        .split('\n')
        .filter((line) => /Rate-limit store failed|Redis circuit|Redis lost writes/.test(line))
        .map((line) => `instance ${i}: ${line.trim()}`),
    );
    console.log(
      [
        `${BURSTS_PER_ROUTE} rounds of a /ip and a /multi burst of ${BURST_SIZE} over ${INSTANCES} instances ` +
          `in ${elapsedS} s (rounds ${spread(roundsMs)} ms); stall ${STALL_MS} ms, gap ${STALL_GAP_MS} ms`,
        ...reports.map((report, i) => `instance ${i}: ${describeStalls(report)}`),
        `/ip admitted per burst (admitted: bursts): ${JSON.stringify(histogram(admitted['/ip']))}`,
        `/multi admitted per burst (admitted: bursts): ${JSON.stringify(histogram(admitted['/multi']))}`,
        `bursts not at ${LIMIT}: ${describeOffLimit(admitted)}`,
        `store-failure and circuit-open lines: ${fallbackLines.length}; requests they report by error: ` +
          JSON.stringify(failuresByError(fallbackLines)),
        ...fallbackLines.slice(0, 10),
      ].join('\n'),
    );

    // Without stalls this test proves nothing.
    expect(reports.map((report) => (report?.stallsMs.length ?? 0) > 0)).toEqual(Array(INSTANCES).fill(true));
    expect(unexpected).toEqual([]);
    expect({ '/ip': histogram(admitted['/ip']), '/multi': histogram(admitted['/multi']) }).toEqual({
      '/ip': { [LIMIT]: BURSTS_PER_ROUTE },
      '/multi': { [LIMIT]: BURSTS_PER_ROUTE },
    });
    // While Redis answers, nothing may be decided by the fallback.
    expect(fallbackLines).toEqual([]);
  });
});

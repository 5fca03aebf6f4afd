/**
 * What a limiter costs a Nest app per HTTP request, side by side in one run: the same app without a
 * limiter (bare), with a guard making one bare EVALSHA (the floor), with this library (embedded
 * store; Redis, with and without its headers, and on a route with `settleCost`: what its interceptor
 * and its settlement after the handler cost), with rate-limiter-flexible
 * (RateLimiterRedis in a guard, with and without its in-memory block) and with @nestjs/throttler on
 * @nest-lab/throttler-storage-redis. Each is `bench/support/http-contender.ts` in a process of its
 * own (one core); autocannon runs in this one (the other core); Redis is a redis-server this script
 * starts on a free loopback port.
 *
 * - admitting: `GET /ping` with a limit far above the load, so every request pays the whole path;
 * - attack: one client over a limit of 5 a minute, so nearly every request is a 429, against the
 *   bare app serving 200s: there the refusal path itself is the budget, and a guard that refuses
 *   every request without asking anyone shows what Nest's own 429 path costs. Ours also runs with
 *   `headers: false`, as the peers answer a refusal with `Retry-After` alone and ours with three
 *   `RateLimit-*` headers beside it by default.
 *
 * Each section starts every contender's app once, warms each up, and keeps them all up through its
 * rounds: a round loads each app in turn for a few seconds, in alternating order, so each round's
 * contenders share the machine's state of that minute. (An app started afresh for each round
 * brought its own warm-up and heap into the figures: the same build's rate spread over a third from
 * one round to the next.) Figures are ratios to the bare app in the same round, and each cell keeps
 * its median over the rounds. App CPU is the contender process's (from /proc), Redis CPU the
 * server's `used_cpu_user + used_cpu_sys`, both per request over the bare app's and per request;
 * RSS the contender's resident memory, and heap the V8 heap it keeps, read after every round, a full
 * collection and 2 s at rest, over the bare app's. (Read right after the load, RSS measured when the
 * collector last ran more than what the app keeps: +/-15 MiB from one run to the next; read once
 * after all rounds, still tens of MiB between contenders that keep nothing.) Below each table,
 * ours-redis over every other contender in the same round (the guard that asks nobody, each peer, a
 * baseline build): the median of these is the verdict on a ratio target.
 *
 * BASELINE=<commit> adds 'ours-redis@<commit>': the same contender as 'ours-redis' on the library as
 * that commit built it (in a temporary git worktree, removed at the end), in the same rounds, so a
 * change to the library is judged against its parent on the same machine at the same time; below
 * each table, ours-redis over it, round by round, with the others.
 *
 *   npm run bench:http          (QUICK=1: one round of 2 s each; BENCH_ROUNDS, BENCH_SECONDS)
 *   BASELINE=f0e3ba6 npm run bench:http
 *   BASELINE=f0e3ba6 CONTENDERS=ours-redis BENCH_ROUNDS=7 npm run bench:http
 *                               (only those beside the bare app: more rounds in the same time)
 */
import autocannon from 'autocannon';
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { Redis } from 'ioredis';
import { startRedisServer } from '../test/support/redis-server.js';
import { type BaselineBuild, buildBaseline } from './support/baseline-build.js';
import { redisCpuUs } from './support/redis-cpu.js';

const QUICK = process.env.QUICK === '1';
/** How long the apps rest after their rounds and a full collection before their memory is read. */
const RSS_AT_REST_MS = 2_000;
const SECONDS = Number(process.env.BENCH_SECONDS ?? (QUICK ? 2 : 3));
const WARM_UP_SECONDS = QUICK ? 1 : 5;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? (QUICK ? 1 : 7));
/** CONTENDERS=a,b: only these (and the bare app, which every ratio needs; the baseline beside 'ours-redis'). */
const ONLY = process.env.CONTENDERS?.split(',').map((name) => name.trim());
const CONNECTIONS = 50;
const ATTACK_LIMIT = 5;
const BASELINE = process.env.BASELINE;
const BASELINE_CONTENDER = `ours-redis@${BASELINE}`;

/**
 * The core each contender runs on alone, while this process (autocannon) and Redis share the
 * others: Linux with `taskset` and at least two cores, unless BENCH_PIN=0. Left to the scheduler,
 * the app, the load and Redis moved between the two cores of the project's machine, and the same
 * contender's rate spread over a third from one round to the next (0.72-1.30 of another build's).
 */
const APP_CORE = pinnedCore();

function pinnedCore(): number | undefined {
  if (process.env.BENCH_PIN === '0' || process.platform !== 'linux' || availableParallelism() < 2) return undefined;
  try {
    execFileSync('taskset', ['-p', String(process.pid)], { stdio: 'ignore' });
  } catch {
    return undefined;
  }
  return availableParallelism() - 1;
}

/** Keeps a process and all its threads on the cores other than the contenders'. */
function keepOffAppCore(pid: number): void {
  if (APP_CORE === undefined) return;
  execFileSync('taskset', ['-a', '-p', '-c', `0-${APP_CORE - 1}`, String(pid)], { stdio: 'ignore' });
}

interface Result {
  perSecond: number;
  p99Ms: number;
  appCpuUs: number;
  redisCpuUs: number;
  /** Resident memory and V8 heap after the round, a full collection and RSS_AT_REST_MS at rest (MiB). */
  rss: number;
  heap: number;
  statuses: string;
}

/** The contenders CONTENDERS keeps, with the baseline, when there is one, right after 'ours-redis'. */
function withBaseline(contenders: readonly string[]): readonly string[] {
  const kept = contenders.filter((c) => c === 'bare' || !ONLY || ONLY.includes(c));
  return BASELINE ? kept.flatMap((c) => (c === 'ours-redis' ? [c, BASELINE_CONTENDER] : [c])) : kept;
}

const ADMITTING = withBaseline([
  'bare',
  'floor',
  'ours-memory',
  'ours-redis',
  'ours-redis-no-headers',
  'ours-redis-settle',
  'rlf',
  'throttler',
]);
const ATTACK = withBaseline([
  'bare',
  'refuse',
  'floor',
  'ours-memory',
  'ours-redis',
  'ours-redis-no-headers',
  'rlf',
  'rlf-block',
  'throttler',
]);

const NAMES: Record<string, string> = {
  bare: 'bare app (no limiter)',
  floor: 'one-EVALSHA floor (a guard)',
  refuse: 'a guard refusing all, asking nobody',
  'ours-redis-no-headers': 'ours, Redis, headers: false',
  'ours-memory': 'ours, embedded store',
  'ours-redis': 'ours, Redis',
  'ours-redis-settle': 'ours, Redis, a settleCost route (interceptor + settlement)',
  rlf: 'rate-limiter-flexible',
  'rlf-block': 'rate-limiter-flexible, in-memory block',
  throttler: '@nestjs/throttler + Redis storage',
  [BASELINE_CONTENDER]: `ours, Redis, as built at ${BASELINE}`,
};

// A misspelt name would leave only the bare app to measure, and a bad count no round at all.
const unknown = ONLY?.filter((name) => !ADMITTING.includes(name) && !ATTACK.includes(name)) ?? [];
if (unknown.length > 0) {
  const names = Object.keys(NAMES).filter((name) => name !== BASELINE_CONTENDER);
  throw new Error(`CONTENDERS: no contender ${unknown.join(', ')}; there are ${names.join(', ')}`);
}
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) {
  throw new Error(`BENCH_ROUNDS: ${process.env.BENCH_ROUNDS} is not a whole number of rounds above 0`);
}

/** Resident memory of a process now, in MiB (Linux: /proc/<pid>/status). */
function processRssMiB(pid: number): number {
  const kib = Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0);
  return kib / 1024;
}

/** User and system CPU of a process so far, in µs (Linux: /proc/<pid>/stat, in clock ticks of 10 ms). */
function processCpuUs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  // After the command: state is field 3, utime 14 and stime 15 (1-based), so 11 and 12 here.
  return (Number(fields[11]) + Number(fields[12])) * 10_000;
}

async function startContender(
  contender: string,
  env: Record<string, string>,
): Promise<{ url: string; pid: number; heapMiB(): number; stop(): Promise<void> }> {
  // Built by tsc (npm run bench:http does): under tsx, the peers' CommonJS builds would load a
  // second copy of @nestjs/core, whose Reflector Nest cannot inject.
  // --expose-gc: the contender collects on SIGUSR2, before its memory is read.
  const node = [process.execPath, '--expose-gc', 'dist/bench/support/http-contender.js'];
  // taskset runs node in its own process: the pid is the app's.
  const command = APP_CORE === undefined ? node : ['taskset', '-c', String(APP_CORE), ...node];
  const child: ChildProcess = spawn(command[0], command.slice(1), {
    env: { ...process.env, ...env, CONTENDER: contender },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  // The heap the app keeps, as it printed it after its last full collection (SIGUSR2).
  let heapBytes = NaN;
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      const lines = output.split('\n');
      output = lines.pop()!;
      for (const line of lines) {
        const [word, value] = line.split(' ');
        if (word === 'listening') resolve(Number(value));
        if (word === 'heap') heapBytes = Number(value);
      }
    });
    child.once('exit', (code) => reject(new Error(`${contender} exited with ${code}:\n${output}`)));
  });
  return {
    url: `http://127.0.0.1:${port}/ping`,
    pid: child.pid!,
    heapMiB: () => heapBytes / 1024 / 1024,
    stop: () =>
      new Promise<void>((resolve) => {
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

type App = Awaited<ReturnType<typeof startContender>>;

/** A contender's app, started for a section and kept up (warm) through all its rounds. */
function startApp(
  contender: string,
  limit: number,
  redisUrl: string,
  baseline: BaselineBuild | undefined,
): Promise<App> {
  const env = { LIMIT: String(limit), REDIS_URL: redisUrl };
  return contender === BASELINE_CONTENDER
    ? startContender('ours-redis', { ...env, LIBRARY_ENTRY: baseline!.entry })
    : startContender(contender, env);
}

/** One round of one contender: its app under load for SECONDS. */
async function measure(app: App, stats: Redis): Promise<Result> {
  const appBefore = processCpuUs(app.pid);
  const redisBefore = await redisCpuUs(stats);
  const result = await autocannon({ url: app.url, connections: CONNECTIONS, duration: SECONDS });
  const appCpu = processCpuUs(app.pid) - appBefore;
  const redisCpu = (await redisCpuUs(stats)) - redisBefore;
  const total = result.requests.total;
  const statuses = Object.entries({
    '2xx': result['2xx'],
    '429': result.non2xx,
    errors: result.errors + result.timeouts,
  })
    .filter(([, n]) => n > 0)
    .map(([name, n]) => `${name} ${n}`)
    .join(', ');
  return {
    perSecond: result.requests.average,
    p99Ms: result.latency.p99,
    appCpuUs: appCpu / total,
    redisCpuUs: redisCpu / total,
    rss: NaN,
    heap: NaN,
    statuses,
  };
}

/** Each app's resident memory and V8 heap after a full collection and RSS_AT_REST_MS at rest (MiB). */
async function restingMemory(apps: ReadonlyMap<string, App>): Promise<Map<string, { rss: number; heap: number }>> {
  for (const app of apps.values()) process.kill(app.pid, 'SIGUSR2');
  await new Promise((resolve) => setTimeout(resolve, RSS_AT_REST_MS));
  return new Map(
    [...apps].map(([contender, app]) => [contender, { rss: processRssMiB(app.pid), heap: app.heapMiB() }]),
  );
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

async function run(
  title: string,
  contenders: readonly string[],
  limitOf: (contender: string) => number,
  redisUrl: string,
  stats: Redis,
  baseline: BaselineBuild | undefined,
): Promise<void> {
  const results = new Map<string, Result[]>();
  const ratios = new Map<string, number[]>();
  await stats.flushall();
  const apps = new Map<string, App>();
  try {
    for (const contender of contenders)
      apps.set(contender, await startApp(contender, limitOf(contender), redisUrl, baseline));
    for (const app of apps.values())
      await autocannon({ url: app.url, connections: CONNECTIONS, duration: WARM_UP_SECONDS });
    for (let round = 0; round < ROUNDS; round += 1) {
      const order = round % 2 === 0 ? contenders : [...contenders].reverse();
      const ofRound = new Map<string, Result>();
      for (const contender of order) ofRound.set(contender, await measure(apps.get(contender)!, stats));
      // Read after every round, not once: one reading caught the collector's and the allocator's
      // state of that moment (tens of MiB between contenders that keep nothing); the median of the
      // rounds' readings is what an app keeps.
      const memory = await restingMemory(apps);
      const bare = ofRound.get('bare')!;
      for (const [contender, result] of ofRound) {
        Object.assign(result, memory.get(contender));
        results.set(contender, [...(results.get(contender) ?? []), result]);
        ratios.set(contender, [...(ratios.get(contender) ?? []), result.perSecond / bare.perSecond]);
      }
    }
  } finally {
    await Promise.all([...apps.values()].map((app) => app.stop()));
  }
  const medianOf = (contender: string, field: keyof Omit<Result, 'statuses'>) =>
    median(results.get(contender)!.map((r) => r[field]));
  const overBare = (contender: string, field: 'appCpuUs' | 'rss' | 'heap', digits: number) =>
    contender === 'bare'
      ? `(${medianOf('bare', field).toFixed(0)} in all)`
      : `+${(medianOf(contender, field) - medianOf('bare', field)).toFixed(digits)}`;
  const rows = [
    `### ${title}`,
    '',
    '| contender | req/s | x bare | p99 ms | app µs/request over bare | Redis µs/request | RSS MiB over bare | heap MiB over bare | responses (last round) |',
    '|---|---|---|---|---|---|---|---|---|',
  ];
  for (const contender of contenders) {
    const all = results.get(contender)!;
    rows.push(
      `| ${NAMES[contender]} | ${Math.round(medianOf(contender, 'perSecond'))} | ` +
        `${median(ratios.get(contender)!).toFixed(2)} | ${medianOf(contender, 'p99Ms')} | ` +
        `${overBare(contender, 'appCpuUs', 0)} | ${medianOf(contender, 'redisCpuUs').toFixed(1)} | ` +
        `${overBare(contender, 'rss', 1)} | ${overBare(contender, 'heap', 1)} | ${all.at(-1)!.statuses} |`,
    );
  }
  // Per round, the contenders shared the machine's state of that minute: the median of ours over
  // each other contender in the same round is the verdict (a baseline build, the guard that asks
  // nobody, a peer), steadier than comparing the medians of two columns.
  const ours = ratios.get('ours-redis');
  const others = contenders.filter((c) => c !== 'bare' && c !== 'ours-redis' && c !== 'floor');
  if (ours && others.length > 0) rows.push('', 'ours-redis over each, same round: median (rounds)', '');
  for (const other of ours ? others : []) {
    const over = ratios.get(other)!.map((theirs, round) => ours![round] / theirs);
    rows.push(`- ${other}: ${median(over).toFixed(3)} (${over.map((r) => r.toFixed(3)).join(', ')})`);
  }
  console.log(rows.join('\n'), '\n');
}

const baseline = BASELINE ? buildBaseline(BASELINE) : undefined;
const server = await startRedisServer();
const stats = new Redis(server.url);
try {
  keepOffAppCore(process.pid);
  keepOffAppCore(server.pid);
  console.log(
    `${CONNECTIONS} connections, ${SECONDS} s per contender after ${WARM_UP_SECONDS} s of warm-up, ` +
      `${ROUNDS} round(s), node ${process.version}${BASELINE ? `, baseline ${BASELINE}` : ''}` +
      `${APP_CORE === undefined ? '' : `, each contender alone on core ${APP_CORE}`}\n`,
  );
  await run(
    'Admitting: GET /ping under a limit no request reaches',
    ADMITTING,
    () => 1_000_000_000,
    server.url,
    stats,
    baseline,
  );
  await run(
    `Attack: one client over ${ATTACK_LIMIT} a minute (the bare app serves 200s)`,
    ATTACK,
    (contender) => (contender === 'bare' ? 1_000_000_000 : ATTACK_LIMIT),
    server.url,
    stats,
    baseline,
  );
} finally {
  stats.disconnect();
  await server.stop();
  baseline?.remove();
}

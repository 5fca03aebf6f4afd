/**
 * The library files one request runs, measured in a process of its own on the built package (what an
 * app installs; in Vitest's transformed modules the script URLs are not the files'). An Express app
 * with `RateLimitModule.forRoot({ redis: REDIS_URL })` and one controller whose two routes have the
 * same rule: `/probe/admitted` measured while its clients are under the limit, `/probe/refused` once
 * they are past it. Each route is warmed up first, then V8's precise coverage is reset and one
 * request sent. Prints one JSON line: for each route, the status, the files as `src/<path>.ts`, the
 * attempts, and what disturbed the last one if every attempt was (see `measure`).
 *
 * Plain JavaScript so that node runs it without a build step: the decorators are applied by hand.
 */
import { createHook } from 'node:async_hooks';
import { get } from 'node:http';
import { Session } from 'node:inspector/promises';
import 'reflect-metadata';

const WARM_UP_REQUESTS = 5;
/** Measurements of a route tried before reporting one that was disturbed (see `measure`). */
const ATTEMPTS = 5;
/** Requests per minute the rule admits: the admitted route's warm-up and every attempt. */
const LIMIT = WARM_UP_REQUESTS + ATTEMPTS;
/** Timers a request leaves behind (the Redis call's deadline, late-answer graces, Node's date cache). */
const SHORT_TIMER_MS = 1_000;

const session = new Session();
session.connect();
await session.post('Profiler.enable');
await session.post('Profiler.startPreciseCoverage', { callCount: true, detailed: true });

// Loaded after the coverage started, so that every function of the library is counted precisely.
const { Controller, Get, Module } = await import('@nestjs/common');
const { NestFactory } = await import('@nestjs/core');
const { RATE_LIMIT_DEFAULTS, RateLimit, RateLimitModule } = await import('nest-rate-limit');
const DEADLINE_MS = RATE_LIMIT_DEFAULTS.storeErrors.timeoutMs;
const DIST = new URL('.', import.meta.resolve('nest-rate-limit')).href;

// Timers and immediates by async id (what each is), from Node's async hooks; `_idleTimeout`,
// `_repeat` and `_destroyed` are fields of Node's Timeout objects.
const timers = new Map();
/** Short one-shot timers not yet known to be done, by id: their Timeout objects. */
const pendingShortTimers = new Map();
let timerDone;
/** While a request is measured: the timers it set, and those set before it that fired during it. */
let measuredWindow;
createHook({
  init(id, type, _trigger, resource) {
    if (type !== 'Timeout' && type !== 'Immediate') return;
    if (type === 'Timeout') {
      const ms = resource._idleTimeout;
      const repeats = resource._repeat !== null;
      timers.set(id, `a ${repeats ? 'repeating ' : ''}timer of ${ms} ms`);
      if (!repeats && ms <= SHORT_TIMER_MS) pendingShortTimers.set(id, resource);
    } else timers.set(id, 'an immediate');
    measuredWindow?.created.add(id);
  },
  before(id) {
    const timer = timers.get(id);
    if (timer && measuredWindow && !measuredWindow.created.has(id)) measuredWindow.earlierTimers.push(timer);
  },
  after(id) {
    if (pendingShortTimers.delete(id)) timerDone?.();
  },
  // Node reports destroys late, when the event loop next wakes: `idle` does not wait for them.
  destroy(id) {
    timers.delete(id);
    if (pendingShortTimers.delete(id)) timerDone?.();
  },
}).enable();

/**
 * Resolves once the short timers earlier requests left have fired or been cleared: a cleared one is
 * marked `_destroyed` at once, a pending one is waited for.
 */
async function idle() {
  for (;;) {
    for (const [id, timeout] of pendingShortTimers) if (timeout._destroyed) pendingShortTimers.delete(id);
    if (pendingShortTimers.size === 0) return;
    await new Promise((resolve) => (timerDone = resolve));
  }
}

class ProbeController {
  admitted() {
    return 'admitted';
  }
  refused() {
    return 'refused';
  }
}
for (const route of ['admitted', 'refused']) {
  const descriptor = Object.getOwnPropertyDescriptor(ProbeController.prototype, route);
  Reflect.decorate(
    [Get(route), RateLimit({ count: LIMIT, window: '1m' })],
    ProbeController.prototype,
    route,
    descriptor,
  );
}
Reflect.decorate([Controller('probe')], ProbeController);

class ProbeModule {}
Reflect.decorate(
  [Module({ imports: [RateLimitModule.forRoot({ redis: process.env.REDIS_URL })], controllers: [ProbeController] })],
  ProbeModule,
);

const app = await NestFactory.create(ProbeModule, { logger: false });
await app.listen(0, '127.0.0.1');
const { port } = app.getHttpServer().address();

/** One GET on a connection of its own; resolves with the status once the body has been read. */
function request(path) {
  return new Promise((resolve, reject) => {
    get({ host: '127.0.0.1', port, path, agent: false }, (response) => {
      response.resume();
      response.once('end', () => resolve(response.statusCode));
    }).once('error', reject);
  });
}

/** The library files with any function or block run at least once since the last take. */
async function executedFiles() {
  const { result } = await session.post('Profiler.takePreciseCoverage');
  return result
    .filter(({ url }) => url.startsWith(DIST))
    .filter(({ functions }) => functions.some(({ ranges }) => ranges.some(({ count }) => count > 0)))
    .map(({ url }) => `src/${url.slice(DIST.length).replace(/\.js$/, '.ts')}`)
    .sort();
}

/**
 * One request, once the timers of the earlier ones are done; the coverage taken after its response
 * and one turn of the event loop (what the library does once the response is out). Two things would
 * make the files not those of one request decided by Redis: a timer set before the request that
 * fires during it (an interval of the library, a Node or ioredis timer) runs code that is not the
 * request's, and a request as slow as the Redis call's deadline (a busy machine) may have been
 * decided by the local fallback. Such a measurement is tried again, and reported with what disturbed
 * it only when every attempt was. The request's own timers that fire after the window (its Redis
 * call's deadline) run more of `redis/call-safety.ts`, already in the list.
 */
async function measure(path) {
  let measured;
  for (let attempt = 1; attempt <= ATTEMPTS; attempt += 1) {
    await idle();
    measuredWindow = { created: new Set(), earlierTimers: [] };
    await session.post('Profiler.takePreciseCoverage'); // resets the counts
    const started = performance.now();
    const status = await request(path);
    const tookMs = performance.now() - started;
    await new Promise((resolve) => setImmediate(resolve));
    const files = await executedFiles();
    const disturbed = measuredWindow.earlierTimers.map((timer) => `${timer} set before the request fired during it`);
    if (tookMs >= DEADLINE_MS)
      disturbed.push(`took ${Math.round(tookMs)} ms, the Redis call's deadline being ${DEADLINE_MS} ms`);
    measuredWindow = undefined;
    measured = { status, files, attempts: attempt, disturbed };
    if (disturbed.length === 0) break;
  }
  return measured;
}

for (let i = 0; i < WARM_UP_REQUESTS; i += 1) await request('/probe/admitted');
const admitted = await measure('/probe/admitted');
for (let i = 0; i < LIMIT + WARM_UP_REQUESTS; i += 1) await request('/probe/refused');
const refused = await measure('/probe/refused');

await app.close();
session.disconnect();
console.log(JSON.stringify({ admitted, refused }));

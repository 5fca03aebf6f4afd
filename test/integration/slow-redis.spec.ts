import { AsyncLocalStorage } from 'node:async_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RateLimitOutcome, RateLimitRuleRef } from 'nest-rate-limit';
import type { RateLimitConsumption } from 'nest-rate-limit/store';
import { until } from '../support/poll.js';
import { startRedisServer } from '../support/redis-server.js';
import { stallRedis } from '../support/redis-stalls.js';
import { createStore } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/*
 * A Redis slower than the deadline, not down: it stalls (a big KEYS, a fork for a snapshot, a noisy
 * neighbour) for 150 ms or 500 ms, a stall starting every 0.4 s (or as soon as the last one ends),
 * for a minute, while three app instances take bursts of 200 requests. Each second has identities
 * of its own. With the default policy (`'local'`), no window may admit more than 1.2x the limit,
 * and the service keeps admitting about the limit while Redis answers at all.
 *
 * Admissions are counted in the window Redis decided them in, as the store's receipt names it (its
 * start), not by the second their burst was sent in. A busy machine holds this process off the CPU
 * for a second now and then, and a second's last requests then reach Redis after the end of the
 * window its first ones opened: Redis rightly decides them in the next one. Counted per second,
 * those were one window of 8 (three rules: 5, then 3 in the next window, where the rule of 8 per
 * 4 s stops them) though no window admitted more than 5. What the local fallback admits has no
 * receipt: it is counted in the window of its key that was running on Redis when the fallback
 * decided (Redis runs on this machine: one clock), or, in none, in a window of its own.
 */

const INSTANCES = 3;
const SECONDS = 60;
const BURST = 200;
const BURSTS_PER_SECOND = 3;
const STALL_EVERY_MS = 400;
/** Requests of a burst that arrive in one turn of the event loop. */
const PER_TURN = 20;
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Rules given whole, by name; the tightest first. */
type Rule = Exclude<RateLimitRuleRef, string>;

/** One rule of 5 per 2 s; and a handler of three rules, whose tightest is 5 per 2 s. */
const ONE_RULE: Rule[] = [{ name: 'one', count: 5, window: '2s' }];
const THREE_RULES: Rule[] = [
  { name: 'tight', count: 5, window: '2s' },
  { name: 'four', count: 8, window: '4s' },
  { name: 'ten', count: 10, window: '10s' },
];
const LIMIT = 5;
const TIGHTEST_WINDOW_MS = 2_000;

/** The tightest rule's window: how many requests it admitted, and of those, how many the local fallback did. */
interface WindowCount {
  admitted: number;
  byFallback: number;
}

interface Figures {
  /** Requests admitted for each second's identities. */
  perSecond: number[];
  /**
   * Per second, whether Redis answered its identities before the second's last burst: on time, or
   * late at the end of a stall that began before. A second whose every burst met one stall had no
   * answer from Redis: its requests were decided at their deadline by the fallback alone.
   */
  metRedis: boolean[];
  /** Every window of the tightest rule that admitted any, of every second's identities. */
  windows: WindowCount[];
  /** Seconds whose requests were admitted in more than one window (delayed past their window's end). */
  split: number;
  stalls: number;
  /** How long each request took to be decided, in ms, sorted. */
  latencies: number[];
}

/** One admitted request: the start of its window as Redis named it, or when the fallback decided it. */
type Admission = { windowStart: number } | { fallbackAt: number };

/**
 * The request running in this context: what Redis answered it (its receipts; unset if nothing was
 * asked of it), and who to tell when Redis answers, on time or late.
 */
interface AskedRequest {
  consumption?: RateLimitConsumption;
  heard(): void;
}
const answered = new AsyncLocalStorage<AskedRequest>();

/** The tightest rule's window of an admitted request, from what Redis answered it. */
function admissionOf(
  outcome: RateLimitOutcome,
  rule: string,
  consumption: RateLimitConsumption | undefined,
): Admission {
  // Decided without Redis's admission: by the fallback, or on units Redis counted late for requests
  // it refused (Redis refused this one on time for want of them).
  if (outcome.storeError || !consumption?.allowed) return { fallbackAt: Date.now() };
  const i = outcome.decisions.findIndex((decision) => decision.rule.name === rule);
  const windowStart = consumption.receipts?.[i]?.windowStart;
  if (windowStart === undefined) throw new Error(`An admission without the receipt of Redis's window (${rule})`);
  return { windowStart };
}

/**
 * A second's admissions by window: those Redis decided, by the start it named; the fallback's, in the
 * Redis window running when it decided, else in one of their own, started by the first of them.
 */
function windowsOf(admissions: readonly Admission[], windowMs: number): WindowCount[] {
  const byRedis = new Map<number, WindowCount>();
  for (const admission of admissions) {
    if (!('windowStart' in admission)) continue;
    const window = byRedis.get(admission.windowStart);
    if (window) window.admitted += 1;
    else byRedis.set(admission.windowStart, { admitted: 1, byFallback: 0 });
  }
  const windows = [...byRedis].map(([start, count]) => ({ start, ...count }));
  const fallbackTimes = admissions.flatMap((admission) => ('fallbackAt' in admission ? [admission.fallbackAt] : []));
  for (const at of fallbackTimes.sort((a, b) => a - b)) {
    let window = windows.find(({ start }) => start <= at && at < start + windowMs);
    if (!window) windows.push((window = { start: at, admitted: 0, byFallback: 0 }));
    window.admitted += 1;
    window.byFallback += 1;
  }
  return windows.map(({ admitted, byFallback }) => ({ admitted, byFallback }));
}

/** A minute of bursts through three instances, for each rule set, while Redis stalls. */
async function slowMinute(stallMs: number): Promise<Map<string, Figures>> {
  const server = await startRedisServer();
  const keyPrefix = uniquePrefix();
  const instances = await Promise.all(
    Array.from({ length: INSTANCES }, () => createStore({ redis: server.url, keyPrefix })),
  );
  try {
    // Every instance has counted the others on Redis (each says hello when it starts listening).
    await until(() => instances.every((instance) => instance.redis.news.instances === INSTANCES), {
      timeoutMs: 10_000,
      what: `every instance counting ${INSTANCES} instances`,
    });
    // Each request's answer from Redis, for the window its receipt names.
    for (const { store } of instances) {
      const consume = store.consume.bind(store);
      store.consume = (hits, now) => {
        const request = answered.getStore();
        return consume(hits, now).then((consumption) => {
          if (request) {
            request.consumption = consumption;
            request.heard();
          }
          return consumption;
        });
      };
    }
    const staller = stallRedis(server, stallMs, STALL_EVERY_MS);
    const sets = new Map([
      ['one rule', ONE_RULE],
      ['three rules', THREE_RULES],
    ]);
    const admissions = new Map(
      [...sets.keys()].map((name) => [name, Array.from({ length: SECONDS }, (): Admission[] => [])]),
    );
    const latencies = new Map([...sets.keys()].map((name): [string, number[]] => [name, []]));
    const burstTimes = Array.from({ length: SECONDS }, (): number[] => []);
    // Per second, when Redis first answered one of its identity's requests, on time or late.
    const firstHeard = new Map([...sets.keys()].map((name) => [name, Array.from({ length: SECONDS }, () => Infinity)]));
    const start = performance.now();
    const bursts: Promise<void>[] = [];
    for (let second = 0; second < SECONDS; second += 1) {
      for (let b = 0; b < BURSTS_PER_SECOND; b += 1) {
        const at = start + second * 1000 + Math.random() * 900;
        bursts.push(
          new Promise<void>((resolve) => setTimeout(resolve, at - performance.now())).then(() => {
            const burstAt = performance.now();
            burstTimes[second].push(burstAt);
            return Promise.all(
              [...sets].map(async ([name, rules]) => {
                const identity = `${name}:${second}`;
                await Promise.all(
                  Array.from({ length: BURST }, async (_, i) => {
                    // A burst arrives as a server reads it, some requests per turn of the event loop.
                    for (let turn = Math.floor(i / PER_TURN); turn > 0; turn -= 1) await nextTurn();
                    const heard = firstHeard.get(name)!;
                    const request: AskedRequest = {
                      heard: () => (heard[second] = Math.min(heard[second], performance.now())),
                    };
                    const sent = performance.now();
                    return answered
                      .run(request, () => instances[i % INSTANCES].limiter.consume(rules, identity))
                      .then((outcome) => {
                        latencies.get(name)!.push(performance.now() - sent);
                        if (outcome.allowed) {
                          admissions.get(name)![second].push(admissionOf(outcome, rules[0].name, request.consumption));
                        }
                      });
                  }),
                );
              }),
            ).then(() => undefined);
          }),
        );
      }
    }
    await Promise.all(bursts);
    await staller.stop();
    return new Map(
      [...admissions].map(([name, seconds]) => {
        const windows = seconds.map((each) => windowsOf(each, TIGHTEST_WINDOW_MS));
        return [
          name,
          {
            perSecond: seconds.map((each) => each.length),
            // Redis's answer (its late answer settles what the fallback decided) came before the last burst.
            metRedis: burstTimes.map((times, second) => firstHeard.get(name)![second] < Math.max(...times)),
            windows: windows.flat(),
            split: windows.filter((each) => each.length > 1).length,
            stalls: staller.ends.length,
            latencies: latencies.get(name)!.sort((a, b) => a - b),
          },
        ];
      }),
    );
  } finally {
    await Promise.all(instances.map((instance) => instance.close()));
    await server.stop();
  }
}

describe('A Redis slower than the deadline: stalls of 150 ms and 500 ms for a minute, three instances', () => {
  const results = new Map<string, Figures>();

  beforeAll(async () => {
    const [short, long] = await Promise.all([slowMinute(150), slowMinute(500)]);
    for (const [name, figures] of short) results.set(`150 ms, ${name}`, figures);
    for (const [name, figures] of long) results.set(`500 ms, ${name}`, figures);
  }, 150_000);

  afterAll(() => {
    const rows = [...results].map(([name, { perSecond, metRedis, windows, split, stalls, latencies }]) => {
      const most = Math.max(...windows.map(({ admitted }) => admitted));
      const over = windows.filter(({ admitted }) => admitted > LIMIT).length;
      const byFallback = windows.reduce((sum, { byFallback }) => sum + byFallback, 0);
      const met = perSecond.filter((_, second) => metRedis[second]);
      const sum = (counts: number[]) => counts.reduce((total, n) => total + n, 0);
      const p99 = latencies[Math.floor(latencies.length * 0.99)];
      return `| ${name} | ${stalls} | ${met.length} | ${Math.min(...met)} | ${sum(met)} | ${sum(perSecond)} | ${most} | ${(most / LIMIT).toFixed(2)}x | ${over} of ${windows.length} | ${split} | ${byFallback} | ${p99.toFixed(0)} | ${latencies[latencies.length - 1].toFixed(0)} |`;
    });
    console.log(
      [
        `limit ${LIMIT} per 2 s, each second's identities their own; ${BURSTS_PER_SECOND} bursts of ${BURST} a second over ${INSTANCES} instances; storeErrors defaults; counted in the windows Redis decided in; request times from the limiter's call to its decision, in this process beside the load`,
        "| stalls, rules | stalls | seconds that met Redis | fewest admitted in one | admitted in those | admitted in all | most in a window | most / limit | windows over the limit | seconds over two windows | admitted without Redis's admission | p99 ms | slowest ms |",
        '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
        ...rows,
      ].join('\n'),
    );
  });

  it('admits at most 1.2x the limit in any window, all instances together', () => {
    expect(results.size).toBe(4);
    for (const [name, { windows }] of results) {
      expect(Math.max(...windows.map(({ admitted }) => admitted)), name).toBeLessThanOrEqual(LIMIT * 1.2);
      // Redis decides what it can: the fallback only the margin, on the calls Redis never answered.
      const byRedis = windows.map(({ admitted, byFallback }) => admitted - byFallback);
      expect(Math.max(...byRedis), name).toBeLessThanOrEqual(LIMIT);
    }
  });

  /*
   * Requests are decided at their deadline (`deadline-promise.spec.ts`), and Redis, once its stall
   * ends, admits up to the limit of the calls it held: the units it admitted for requests already
   * refused are taken by the next ones of their identities. So a second whose identities heard from
   * Redis before their last burst admits about the limit. One whose every burst met a single stall
   * (a stall of 500 ms leaves Redis a few ms every 0.5 s: about one second in four) had nothing
   * from Redis by its deadlines, and no instance can admit past the margin then: another may have
   * had the whole limit on time just before the stall, and 1.2x of 5 on three instances leaves no
   * whole unit to each.
   *
   * A second heard from Redis when an answer to one of its requests, on time or late, reached the
   * app before the second's last burst: seen, not inferred. (Inferred from a stall's end between
   * two bursts, it was wrong whenever Redis started the next stall before the calls it had held,
   * which then waited a second stall: on a slower day, a quarter of those seconds.) Still most, not
   * all, of them admit their share: a burst's requests spread over three instances, and the units
   * Redis admitted late are banked on the instances that asked; all of them together admit nearly
   * their limit's worth.
   */
  it('keeps admitting about the limit in the seconds that heard from Redis', () => {
    for (const [name, { perSecond, metRedis, stalls }] of results) {
      // The stalls ran all along (a stall of 500 ms every 0.5 s or so leaves Redis a few ms between).
      expect(stalls, name).toBeGreaterThan(stallsExpected(name));
      const met = perSecond.filter((_, second) => metRedis[second]);
      // Enough seconds did for what follows to say something: with stalls of 150 ms nearly all (56-58
      // of 60: in the others the bursts came close together); with stalls of 500 ms back to back,
      // about a quarter (13-20: in the others the last burst came before Redis's late answer).
      expect(met.length, name).toBeGreaterThanOrEqual(name.startsWith('150') ? SECONDS - 6 : SECONDS / 6);
      // Most of them admitted at least one instance's share of 1.2x, and together they
      // admitted nearly their limit's worth.
      const share = Math.floor((LIMIT * 1.2) / INSTANCES);
      expect(met.filter((admitted) => admitted >= share).length, name).toBeGreaterThanOrEqual(0.8 * met.length);
      const admitted = met.reduce((sum, n) => sum + n, 0);
      expect(admitted, name).toBeGreaterThanOrEqual(0.8 * LIMIT * met.length);
    }
  });
});

/** At least half the stalls the schedule asks for in the minute. */
function stallsExpected(name: string): number {
  const every = name.startsWith('150') ? STALL_EVERY_MS : 500;
  return Math.floor((SECONDS * 1000) / every / 2);
}

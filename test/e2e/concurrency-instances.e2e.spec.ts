import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type DemoProcess, startDemoProcess } from '../support/demo-process.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';

/**
 * The demo's export route (`@RateLimit({ concurrency: 10, by: 'global' })`) served by three demo
 * processes on one Redis. Each answer says when its handler started and ended on the machine's
 * monotonic clock, which every process reads alike, so the test counts what ran at once across
 * all three, from the handlers' own times.
 */

const INSTANCES = 3;
const CAP = 10;
/** How long a crashed instance's slots may stay taken: the lease, and a little for the poll. */
const LEASE_MS = 30_000;

interface Ran {
  startedAt: number;
  endedAt: number;
}

function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** The most handlers that ran at once: an end and a start at one instant do not overlap. */
function mostAtOnce(runs: readonly Ran[]): number {
  const events = runs.flatMap(({ startedAt, endedAt }) => [
    [startedAt, 1],
    [endedAt, -1],
  ]);
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let now = 0;
  let most = 0;
  for (const [, step] of events) {
    now += step;
    most = Math.max(most, now);
  }
  return most;
}

describe('a concurrency cap across three instances (processes) on one Redis', () => {
  let server: RedisServer;
  const demos: DemoProcess[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    const env = { RATE_LIMIT_PREFIX: uniquePrefix(), REDIS_URL: server.url };
    await Promise.all(Array.from({ length: INSTANCES }, () => startDemoProcess(env, demos)));
  }, 60_000);

  afterAll(async () => {
    await Promise.all(demos.map((demo) => demo.stop()));
    await server?.stop();
  });

  /** One export on `demo` running `ms`: its status, and its handler's times when admitted. */
  async function exportOn(demo: DemoProcess, ms: number, signal?: AbortSignal): Promise<{ status: number; ran?: Ran }> {
    const response = await fetch(`${demo.url}/exports?ms=${ms}`, { signal });
    if (response.status !== 200) {
      await response.arrayBuffer();
      return { status: response.status };
    }
    return { status: 200, ran: (await response.json()) as Ran };
  }

  /**
   * `count` exports sent at once over the instances, each sent again after a refusal (after 5 to
   * 25 ms, as an impatient client would) until admitted; at most 400 tries each.
   */
  async function exportsRetrying(count: number, ms: number): Promise<{ runs: Ran[]; refusals: number }> {
    let refusals = 0;
    const runs = await Promise.all(
      Array.from({ length: count }, async (_, i) => {
        for (let attempt = 0; attempt < 400; attempt += 1) {
          const { status, ran } = await exportOn(demos[(i + attempt) % demos.length], ms);
          if (ran) return ran;
          expect(status).toBe(429);
          refusals += 1;
          await new Promise((resolve) => setTimeout(resolve, 5 + Math.random() * 20));
        }
        throw new Error(`export ${i} was never admitted`);
      }),
    );
    return { runs, refusals };
  }

  it('300 exports at once: never more than 10 run at once, in every sample, and all run', async () => {
    const { runs, refusals } = await exportsRetrying(300, 50);
    expect(runs).toHaveLength(300);
    expect(refusals).toBeGreaterThan(0);
    expect(mostAtOnce(runs)).toBeLessThanOrEqual(CAP);
    // The cap was used, not only kept: some moment had all ten slots running.
    expect(mostAtOnce(runs)).toBe(CAP);
  }, 120_000);

  /**
   * `CAP + 5` exports of `ms` sent at once (over `on`), resolved once the five the cap refused have
   * answered: the other ten hold every slot. Nothing else is sent meanwhile, so exactly ten are in.
   */
  async function fillTheCap(on: readonly DemoProcess[], ms: number, signal?: AbortSignal): Promise<Promise<number>[]> {
    let refused = 0;
    let wake: () => void = () => undefined;
    const sent = Array.from({ length: CAP + 5 }, (_, i) =>
      exportOn(on[i % on.length], ms, signal).then(
        ({ status }) => {
          if (status === 429) refused += 1;
          wake();
          return status;
        },
        () => 0,
      ),
    );
    while (refused < 5) await new Promise<void>((resolve) => (wake = resolve));
    return sent;
  }

  it('clients gone mid-request keep their slots until their handlers end', async () => {
    const sentAt = monotonicMs();
    const abort = new AbortController();
    const sent = await fillTheCap(demos, 1_500, abort.signal);
    abort.abort();
    const statuses = await Promise.all(sent);
    expect(statuses.filter((status) => status === 0)).toHaveLength(CAP);
    // Their handlers still run: the cap holds for them.
    expect((await exportOn(demos[1], 0)).status).toBe(429);
    // Each gone request's handler ran 1.5 s from after `sentAt`: none of these starts before then.
    const { runs } = await exportsRetrying(30, 50);
    expect(Math.min(...runs.map(({ startedAt }) => startedAt))).toBeGreaterThanOrEqual(sentAt + 1_500);
    expect(mostAtOnce(runs)).toBeLessThanOrEqual(CAP);
  }, 60_000);

  it('an instance killed (SIGKILL) with requests in flight: its slots come back within the lease', async () => {
    const [doomed, ...others] = demos;
    const sent = await fillTheCap([doomed], 60_000);
    await doomed.kill();
    const killedAt = performance.now();
    expect((await Promise.all(sent)).filter((status) => status === 0)).toHaveLength(CAP);
    // Still taken just after the crash: nothing but the lease gives them back.
    expect((await exportOn(others[1], 0)).status).toBe(429);
    await until(async () => (await exportOn(others[0], 0)).status === 200, {
      timeoutMs: LEASE_MS + 5_000,
      intervalMs: 250,
      what: "the killed instance's slots back",
    });
    expect(performance.now() - killedAt).toBeLessThanOrEqual(LEASE_MS + 1_000);
    // All of them: ten exports run at once again, over the two instances left.
    const again = await Promise.all(Array.from({ length: CAP }, (_, i) => exportOn(others[i % others.length], 300)));
    expect(again.map(({ status }) => status)).toEqual(Array(CAP).fill(200));
  }, 90_000);
});

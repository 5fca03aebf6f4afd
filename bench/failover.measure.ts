/**
 * Over-admission around a Sentinel failover that loses the last writes.
 *
 *   npm run bench:failover                            # the defences on
 *   DETECT_LOST_WRITES=false npm run bench:failover   # without the lost-write check
 *   ALGORITHM=token-bucket npm run bench:failover     # another algorithm (default fixed-window)
 *   NO_FAILOVER=true npm run bench:failover           # the same traffic, no failover: the control
 *
 * A master, its replica and three sentinels on loopback. One app instance limits a route to
 * LIMIT requests per WINDOW (fixed window, one counter) and receives twice that rate, evenly. A few
 * seconds into the run the replica is detached (REPLICAOF NO ONE), so the counts written after
 * that exist only on the master; then the master is killed and the sentinels promote the replica,
 * which lacks those counts. Reported: requests admitted per window of the limiter, against the limit.
 */
import { Controller, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { RateLimit, type RateLimitAlgorithmName } from 'nest-rate-limit';
import { type RedisSentinelSet, startRedisSentinelSet } from '../test/support/redis-server.js';
import { admittedPerWindow, paced } from '../test/support/traffic.js';
import { createTestApp, uniquePrefix } from '../test/support/test-app.js';

const LIMIT = 100;
const WINDOW_MS = 10_000;
const RATE_PER_S = (2 * LIMIT) / (WINDOW_MS / 1000);
const RUN_MS = 40_000;
// Detached early in a window, killed before it ends: the promoted replica lacks most of its counts.
const DETACH_AT_MS = 11_000;
const KILL_AT_MS = 13_000;
const ALGORITHM = (process.env.ALGORITHM ?? 'fixed-window') as RateLimitAlgorithmName;
const FAILOVER = process.env.NO_FAILOVER !== 'true';

@Controller('route')
class RouteController {
  @Get()
  @RateLimit({ name: 'route', count: LIMIT, window: WINDOW_MS, by: 'global', algorithm: ALGORITHM })
  get() {
    return {};
  }
}

/**
 * The most a window admitted, by what the algorithm promises (times in ms since the traffic began,
 * sorted; `epoch`: the traffic's start as a `Date.now()` time):
 * - fixed window, sliding log: any span of one window (a fixed window's start at the first request
 *   is this clock's within a few ms; a sliding log promises every span);
 * - sliding window: each window aligned as it aligns them (multiples of the window since the epoch);
 * - token bucket, GCRA: what passed since the start less what the bucket allows since (its burst,
 *   then the limit per window), added to one window's limit: a bucket refused during an outage may
 *   catch up after it, as it would have admitted then.
 */
function worstWindow(admitted: readonly number[], epoch: number): { admitted: number; how: string } {
  if (ALGORITHM === 'token-bucket' || ALGORITHM === 'gcra') {
    let excess = -Infinity;
    admitted.forEach((at, i) => (excess = Math.max(excess, i + 1 - (LIMIT + (LIMIT * at) / WINDOW_MS))));
    return {
      admitted: LIMIT + Math.max(0, Math.ceil(excess)),
      how: 'the limit plus the most admitted since the start beyond the burst and the rate',
    };
  }
  if (ALGORITHM === 'sliding-window') {
    // Its promise at each admission: the previous aligned window's count, weighted by the part of it
    // the sliding window still covers, plus the current one's, within the limit.
    const perWindow = new Map<number, number>();
    let most = 0;
    for (const at of admitted) {
      const time = epoch + at;
      const index = Math.floor(time / WINDOW_MS);
      const current = (perWindow.get(index) ?? 0) + 1;
      perWindow.set(index, current);
      const previous = perWindow.get(index - 1) ?? 0;
      most = Math.max(most, (previous * (WINDOW_MS - (time - index * WINDOW_MS))) / WINDOW_MS + current);
    }
    return {
      admitted: Math.round(most),
      how: 'its estimate at an admission: the previous aligned window weighted, plus the current',
    };
  }
  let most = 0;
  for (let i = 0, j = 0; i < admitted.length; i += 1) {
    while (j < admitted.length && admitted[j] < admitted[i] + WINDOW_MS) j += 1;
    most = Math.max(most, j - i);
  }
  return { admitted: most, how: `the most within any ${WINDOW_MS} ms` };
}

describe('failover with lost writes', () => {
  let set: RedisSentinelSet;
  let app: INestApplication;

  beforeAll(async () => {
    set = await startRedisSentinelSet(1_000);
    app = await createTestApp({
      controllers: [RouteController],
      rateLimit: {
        redis: { sentinels: set.sentinelAddresses, name: set.name },
        keyPrefix: uniquePrefix(),
        // DETECT_LOST_WRITES=false measures without the lost-write check, for contrast.
        failover: { detectLostWrites: process.env.DETECT_LOST_WRITES !== 'false' },
      },
    });
  });

  afterAll(async () => {
    await app?.close();
    await set?.stop();
  });

  it('admitted per window around the failover', async () => {
    // When the sentinels announced the new master, on the traffic's clock.
    let started = 0;
    let switchedAt: number | undefined;
    const sentinel = set.sentinels[1].client();
    sentinel.on('message', () => {
      switchedAt ??= performance.now() - started;
    });
    await sentinel.subscribe('+switch-master');
    const events: string[] = [];
    started = performance.now();
    const { samples } = await paced({
      durationMs: RUN_MS,
      ratePerS: RATE_PER_S,
      send: () => request(app.getHttpServer()).get('/route'),
      events: FAILOVER
        ? [
            {
              atMs: DETACH_AT_MS,
              run: async () => {
                await set.replica.client().replicaof('NO', 'ONE');
                events.push(`+${DETACH_AT_MS} ms: replica detached`);
              },
            },
            {
              atMs: KILL_AT_MS,
              run: async () => {
                await set.master.kill();
                events.push(`+${KILL_AT_MS} ms: master killed`);
              },
            },
          ]
        : [],
    });
    // paced's clock starts within a millisecond of `started`.
    const back = samples
      .filter((s) => s.fromRedis && s.answeredAt > KILL_AT_MS)
      .map((s) => s.answeredAt)
      .sort((a, b) => a - b)[0];
    const admittedAt = samples.filter((s) => s.status === 200).map((s) => s.due);

    const rows = admittedPerWindow(samples, WINDOW_MS, RUN_MS / WINDOW_MS).map(
      (admitted, index) =>
        `| ${index * (WINDOW_MS / 1000)}-${(index + 1) * (WINDOW_MS / 1000)} s | ${admitted} | ${(admitted / LIMIT).toFixed(2)}x |`,
    );
    const worst = worstWindow(
      [...admittedAt].sort((a, b) => a - b),
      performance.timeOrigin + started,
    );
    console.log(
      [
        `${ALGORITHM}, limit ${LIMIT} per ${WINDOW_MS} ms, offered ${RATE_PER_S}/s (2x the limit), detectLostWrites ${process.env.DETECT_LOST_WRITES !== 'false'}${FAILOVER ? '' : ', no failover (control)'}`,
        ...events,
        '| window | admitted | of the limit |',
        '|---|---:|---:|',
        ...rows,
        `worst window: ${worst.admitted} admitted, ${(worst.admitted / LIMIT).toFixed(2)}x the limit (${worst.how})`,
        `sentinels announced the new master ${switchedAt === undefined ? '(not seen)' : `${(switchedAt - KILL_AT_MS).toFixed(0)} ms after the kill`}; ` +
          `first request decided by Redis again ${back === undefined ? '(none)' : `${(back - KILL_AT_MS).toFixed(0)} ms after the kill`}`,
      ].join('\n'),
    );
  });
});

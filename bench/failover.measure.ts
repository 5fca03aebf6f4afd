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
import { RateLimit } from 'nest-rate-limit';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import { type RedisSentinelSet, startRedisSentinelSet } from '../test/support/redis-server.js';
import { admittedPerWindow, paced } from '../test/support/traffic.js';
import { createTestApp, uniquePrefix } from '../test/support/test-app.js';
import { worstWindow } from '../test/support/worst-window.js';

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
    // On Date.now()'s clock, as the sliding window aligns its windows on it.
    const admittedAt = samples.filter((s) => s.status === 200).map((s) => performance.timeOrigin + started + s.due);

    const rows = admittedPerWindow(samples, WINDOW_MS, RUN_MS / WINDOW_MS).map(
      (admitted, index) =>
        `| ${index * (WINDOW_MS / 1000)}-${(index + 1) * (WINDOW_MS / 1000)} s | ${admitted} | ${(admitted / LIMIT).toFixed(2)}x |`,
    );
    const worst = worstWindow(
      ALGORITHM,
      { limit: LIMIT, windowMs: WINDOW_MS },
      [...admittedAt].sort((a, b) => a - b),
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

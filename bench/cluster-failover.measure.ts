/**
 * Over-admission around a Cluster failover that loses the last writes.
 *
 *   npm run bench:cluster-failover
 *
 * A 3-master Cluster with a replica each, on loopback; three app instances. One route is limited
 * globally (LIMIT per WINDOW, one counter), another per client (CLIENT_LIMIT per WINDOW, CLIENTS
 * clients); each is offered twice its limit, evenly, spread over the instances. A few seconds in,
 * the replica of the shard holding the global counter is cut off from its master (it replicates
 * nothing more), then the master is killed: the Cluster promotes the replica, lacking the counts
 * written meanwhile. Reported: admitted per window, globally and for the worst client on
 * that shard, against the limits, and when requests were decided by Redis again.
 */
import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { clusterPair } from '../test/support/lossy-failover.js';
import { type RedisCluster, startRedisCluster } from '../test/support/redis-server.js';
import { type PacedSample, paced } from '../test/support/traffic.js';
import { createTestApp, uniquePrefix } from '../test/support/test-app.js';

const LIMIT = 100;
const CLIENT_LIMIT = 10;
const CLIENTS = 10;
const WINDOW_MS = 10_000;
const RUN_MS = 40_000;
const DETACH_REPLICA_AT_MS = 11_000;
const KILL_MASTER_AT_MS = 13_000;

const byClient = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-client'];

@Controller()
class RoutesController {
  @Get('global')
  @RateLimit({ name: 'global', count: LIMIT, window: WINDOW_MS, by: 'global' })
  global() {
    return {};
  }

  @Get('client')
  @RateLimit({ name: 'client', count: CLIENT_LIMIT, window: WINDOW_MS, by: byClient })
  client() {
    return {};
  }
}

/**
 * Admitted (and passing `which`) per window of a key, as a fixed window on Redis's clock makes them:
 * one starts at the key's first request after the last one ended. The traffic's period does not
 * divide the window, so no request falls on an end, where the order of two clocks would decide.
 */
function perLimiterWindow(
  own: readonly PacedSample[],
  count: number,
  which: (s: PacedSample) => boolean = () => true,
): number[] {
  const admitted: number[] = Array.from({ length: count }, () => 0);
  let window = -1;
  let end = -Infinity;
  for (const s of [...own].sort((a, b) => a.due - b.due)) {
    if (s.due >= end) {
      window += 1;
      end = s.due + WINDOW_MS;
    }
    if (window < count && s.status === 200 && which(s)) admitted[window] += 1;
  }
  return admitted;
}

describe('Cluster failover with lost writes', () => {
  let cluster: RedisCluster;
  let apps: INestApplication[];

  beforeAll(async () => {
    cluster = await startRedisCluster(3, true);
    const keyPrefix = uniquePrefix();
    apps = await Promise.all(
      [0, 1, 2].map(() =>
        createTestApp({
          controllers: [RoutesController],
          rateLimit: { redis: { cluster: cluster.startupNodes }, keyPrefix },
        }),
      ),
    );
  }, 60_000);

  afterAll(async () => {
    await Promise.all((apps ?? []).map((app) => app.close()));
    await cluster?.stop();
  });

  it('admitted per window around the failover', async () => {
    // The shard of the global counter (`{global}`, its hash tag).
    const pair = await clusterPair(cluster, '{global}');
    const events: string[] = [];
    // Each request goes to the next instance; even ones to the global route, odd ones to a client.
    const route = (i: number) => (i % 2 === 0 ? 'global' : `client c${Math.floor(i / 2) % CLIENTS}`);
    const { samples } = await paced({
      durationMs: RUN_MS,
      // Twice each limit, a little more: 40.1 a second, so that a window (10 s) holds 200.5 periods
      // of the global route and 20.05 of each client's, and no request falls on a window's end.
      ratePerS: 2 * ((2 * LIMIT) / (WINDOW_MS / 1000)) + 0.1,
      send: (i) => {
        const app = apps[i % 3].getHttpServer();
        if (i % 2 === 0) return request(app).get('/global');
        return request(app)
          .get('/client')
          .set('x-client', `c${Math.floor(i / 2) % CLIENTS}`);
      },
      events: [
        {
          atMs: DETACH_REPLICA_AT_MS,
          run: async () => {
            // For good: it reconnects with credentials the master refuses, and stays fit for promotion.
            await pair.cut();
            events.push(
              `+${DETACH_REPLICA_AT_MS} ms: the replica of the global counter's shard cut off from its master`,
            );
          },
        },
        {
          atMs: KILL_MASTER_AT_MS,
          run: async () => {
            await pair.master.kill();
            events.push(`+${KILL_MASTER_AT_MS} ms: its master killed`);
          },
        },
      ],
    });
    const windows = RUN_MS / WINDOW_MS;
    const globalSamples = samples.filter((s) => route(s.index) === 'global');
    const global = perLimiterWindow(globalSamples, windows);
    // Of those, decided by the local fallback (no RateLimit headers: Redis did not answer).
    const byFallback = perLimiterWindow(globalSamples, windows, (s) => !s.fromRedis);
    // Per client: the worst client in each window.
    const perClient = new Map<string, PacedSample[]>();
    for (const s of samples) {
      const name = route(s.index);
      if (name !== 'global') perClient.set(name, [...(perClient.get(name) ?? []), s]);
    }
    const clientWindows = [...perClient.values()].map((own) => perLimiterWindow(own, windows));
    const worstClient = Array.from({ length: windows }, (_, w) => Math.max(...clientWindows.map((own) => own[w])));
    const back = samples
      .filter((s) => s.fromRedis && s.answeredAt > KILL_MASTER_AT_MS && route(s.index) === 'global')
      .map((s) => s.answeredAt)
      .sort((a, b) => a - b)[0];
    const failed = samples.filter((s) => s.status >= 500).length;
    console.log(
      [
        `3 masters with a replica each, 3 app instances; global ${LIMIT} and per client ${CLIENT_LIMIT} (${CLIENTS} clients) per ${WINDOW_MS} ms, each offered 2x`,
        ...events,
        '| window of the limiter | global admitted | of the limit | of which by the fallback | worst client | of its limit |',
        '|---|---:|---:|---:|---:|---:|',
        ...global.map(
          (admitted, w) =>
            `| ${w + 1} | ${admitted} | ${(admitted / LIMIT).toFixed(2)}x | ${byFallback[w]} | ${worstClient[w]} | ${(worstClient[w] / CLIENT_LIMIT).toFixed(2)}x |`,
        ),
        `5xx: ${failed}; the global counter decided by Redis again ${back === undefined ? '(never)' : `${(back - KILL_MASTER_AT_MS).toFixed(0)} ms after the kill`}`,
      ].join('\n'),
    );
  });
});

import type { INestApplication } from '@nestjs/common';
import { afterAll, describe, expect, it } from 'vitest';
import type { RateLimitModuleOptions } from 'nest-rate-limit';
import { type RateLimitAlgorithmName, rateLimitKeys } from 'nest-rate-limit/store';
import { storedState } from '../support/inspect.js';
import { failOverLosingWrites, failoverApp, sentinelPair } from '../support/lossy-failover.js';
import { type RedisSentinelSet, startRedisSentinelSet } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';
import { type WorstWindow, worstWindow } from '../support/worst-window.js';

/** The fixed window's failover is `failover-loss.spec.ts`'s; these are the other four. */
const ALGORITHMS = ['sliding-window', 'sliding-log', 'token-bucket', 'gcra'] as const;
const LIMIT = 20;
/** An hour: nothing refills, and no window ends, within a case (the reading allows for one that does). */
const WINDOW = '1h';
const WINDOW_MS = 3_600_000;
/** Admitted on the master after its replica was cut off: lost with the master. */
const UNREPLICATED = 10;
/** Admitted before, and replicated: the window nearly full when the master dies. */
const REPLICATED = LIMIT - 2 - UNREPLICATED;

/** The defaults: behind Sentinel, `detectLostWrites: 'auto'` turns the lost-write check on. */
const DEFAULTS: RateLimitModuleOptions['failover'] = undefined;

interface Figures {
  algorithm: RateLimitAlgorithmName;
  defences: string;
  before: number;
  after: number;
  worst: WorstWindow;
}

/**
 * A real Sentinel failover that loses writes, per algorithm: a master, its replica and three
 * sentinels; one app instance limiting a route to 20 an hour; 8 admissions replicated, the
 * replica's replication cut (`REPLICAOF NO ONE`), 10 admitted on the master alone, the master killed,
 * the replica promoted, the client following it. Then twice the limit offered. Nothing is offered to
 * the route while Redis is out, so the local fallback never decides its window and the lost-write
 * check alone holds it. Asserted: what failure-modes.md documents, the worst window at most the
 * limit, read as each algorithm promises (`worstWindow`).
 */
describe('a Sentinel failover that loses writes, for the algorithms other than the fixed window', () => {
  const figures: Figures[] = [];
  const sets: RedisSentinelSet[] = [];
  const apps: INestApplication[] = [];

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await Promise.all(sets.map((set) => set.stop()));
    console.log(
      [
        `limit ${LIMIT} per ${WINDOW}, one counter, one app instance; ${REPLICATED} replicated, ${UNREPLICATED} lost; ${2 * LIMIT} offered after the failover`,
        '| algorithm | failover | admitted before | after | worst window | of the limit |',
        '|---|---|---:|---:|---:|---:|',
        ...figures.map(
          ({ algorithm, defences, before, after, worst }) =>
            `| ${algorithm} | ${defences} | ${before} | ${after} | ${worst.admitted} | ${(worst.admitted / LIMIT).toFixed(2)}x |`,
        ),
      ].join('\n'),
    );
  });

  async function failover(
    algorithm: RateLimitAlgorithmName,
    defences: RateLimitModuleOptions['failover'],
  ): Promise<Figures> {
    const set = await startRedisSentinelSet(1_000);
    sets.push(set);
    const prefix = uniquePrefix();
    const { app, send, probe } = await failoverApp(
      { count: LIMIT, window: WINDOW, algorithm },
      { redis: { sentinels: set.sentinelAddresses, name: set.name }, keyPrefix: prefix, failover: defences },
    );
    apps.push(app);
    const { key } = rateLimitKeys(prefix, 'route', 'global', algorithm);

    const loss = await failOverLosingWrites(await sentinelPair(set), {
      send,
      probe,
      replicated: REPLICATED,
      unreplicated: UNREPLICATED,
      offered: 2 * LIMIT,
      beforeKill: async (master, replica) => {
        // The replica holds the window, but not its last admissions.
        expect(await storedState(replica, key)).not.toBeNull();
        expect(await storedState(replica, key)).not.toEqual(await storedState(master, key));
      },
    });
    expect(loss.replicated.count(200) + loss.unreplicated.count(200)).toBe(LIMIT - 2);
    // Every one offered after decided by the new master, none by the fallback (any that was is
    // named with its status and time, to tell a deadline missed from a reconnection). A sentinel
    // announcing the switch after the client reached the new master once took it off again
    // (`withoutIdleSwitches`).
    const byFallback = loss.after.samples.filter((sample) => !sample.fromRedis);
    expect(byFallback, `${algorithm}: decided without Redis after the failover`).toEqual([]);
    const result: Figures = {
      algorithm,
      defences: defences === undefined ? 'the defaults' : JSON.stringify(defences),
      before: LIMIT - 2,
      after: loss.after.count(200),
      worst: worstWindow(algorithm, { limit: LIMIT, windowMs: WINDOW_MS }, loss.admittedAt),
    };
    figures.push(result);
    return result;
  }

  it('with the lost-write check (on by default behind Sentinel), the worst window admits the limit, no more', async () => {
    // Each algorithm on servers of its own, side by side.
    const results = await Promise.all(ALGORITHMS.map((algorithm) => failover(algorithm, DEFAULTS)));
    for (const { algorithm, before, after, worst } of results) {
      expect(worst.admitted, `${algorithm}: ${worst.how}`).toBeLessThanOrEqual(LIMIT);
      // And the check refuses nothing the limit allows.
      expect(before + after, algorithm).toBeGreaterThanOrEqual(LIMIT);
    }
  }, 150_000);
});

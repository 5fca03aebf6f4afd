import type { INestApplication } from '@nestjs/common';
import { afterAll, describe, expect, it } from 'vitest';
import type { RateLimitModuleOptions } from 'nest-rate-limit';
import { rateLimitKeys } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { failOverLosingWrites, failoverApp, sentinelPair } from '../support/lossy-failover.js';
import { type RedisSentinelSet, startRedisSentinelSet } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';

const LIMIT = 20;
/** Long enough that every step of a case falls in one window of the rule. */
const WINDOW = '1m';
/** Admitted on the master after its replica was cut off: lost with the master. */
const UNREPLICATED = 10;

/**
 * How the replica falls behind before the master dies:
 * - `'partly'`: it has the window's first admissions (replicated, confirmed by `WAIT`), then is cut
 *   off (`REPLICAOF NO ONE`), and the master admits `UNREPLICATED` more;
 * - `'none'`: it is cut off before the window's first admission, so it lacks the counter entirely
 *   (and its marker, written by the same script on the same master).
 */
type Lag = 'partly' | 'none';

const DEFENCES: Record<string, NonNullable<RateLimitModuleOptions['failover']>> = {
  'no defence': { detectLostWrites: false, marker: false },
  // The defaults: behind Sentinel, `detectLostWrites: 'auto'` turns the check on; no marker.
  'lost-write check alone (the defaults)': {},
  'lost-write check + marker (0.8)': { detectLostWrites: true, marker: 0.8 },
  'marker alone (0.8)': { detectLostWrites: false, marker: 0.8 },
};

const order = (defences: string) => Object.keys(DEFENCES).indexOf(defences);

/** What one case admitted of one rule's window: before the failover, after it, in all. */
interface Figures {
  defences: string;
  lag: Lag;
  before: number;
  after: number;
}

/**
 * A real failover that loses writes: a master, its replica and three sentinels; the replica's
 * replication cut, admissions on the master alone, the master killed (SIGKILL), the sentinels
 * promote the replica, and the app's client follows them to it. Then twice the limit is offered,
 * within the same window. Measured per set of defences: requests admitted above the limit in that
 * window (the lost-write check knows the window by its start on Redis, and remembers what it saw;
 * the marker is a key of the master's, written by the same script as the counter).
 */
describe('a Sentinel failover that loses the last writes: what each defence admits above the limit', () => {
  const figures: Figures[] = [];
  const sets: RedisSentinelSet[] = [];
  const apps: INestApplication[] = [];

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await Promise.all(sets.map((set) => set.stop()));
    console.log(
      [
        `limit ${LIMIT} per ${WINDOW} (fixed window, one counter, one app instance); ${2 * LIMIT} offered after the failover`,
        '| replica lacked | defences | admitted before | after | in the window | above the limit |',
        '|---|---|---:|---:|---:|---:|',
        ...figures.map(
          ({ defences, lag, before, after }) =>
            `| ${lag === 'partly' ? `the last ${UNREPLICATED} admissions` : 'the whole window'} | ${defences} | ${before} | ${after} | ${before + after} | ${Math.max(0, before + after - LIMIT)} |`,
        ),
      ].join('\n'),
    );
  });

  async function failover(lag: Lag, defences: string): Promise<Figures> {
    const set = await startRedisSentinelSet(1_000);
    sets.push(set);
    const prefix = uniquePrefix();
    const { app, send, probe } = await failoverApp(
      { count: LIMIT, window: WINDOW },
      { redis: { sentinels: set.sentinelAddresses, name: set.name }, keyPrefix: prefix, failover: DEFENCES[defences] },
    );
    apps.push(app);
    const { key } = rateLimitKeys(prefix, 'route', 'global', 'fixed-window');

    const loss = await failOverLosingWrites(await sentinelPair(set), {
      send,
      probe,
      replicated: lag === 'partly' ? LIMIT - 2 - UNREPLICATED : 0,
      unreplicated: UNREPLICATED,
      offered: 2 * LIMIT,
      beforeKill: async (master, replica, before) => {
        expect(await fixedWindowCount(master, key)).toBe(before);
        expect(await fixedWindowCount(replica, key)).toBe(lag === 'partly' ? before - UNREPLICATED : null);
      },
    });
    // Every one offered after decided by the new master, none by the fallback.
    expect(loss.after.samples.every((sample) => sample.fromRedis)).toBe(true);
    const before = loss.replicated.count(200) + loss.unreplicated.count(200);
    const result = { defences, lag, before, after: loss.after.count(200) };
    figures.push(result);
    figures.sort((a, b) => b.lag.localeCompare(a.lag) || order(a.defences) - order(b.defences));
    return result;
  }

  it('the replica lacked the last admissions of a window: the check holds the window to its limit; the marker adds nothing', async () => {
    // Each case on servers of its own, side by side.
    const [none, check, both, marker] = await Promise.all(
      [
        'no defence',
        'lost-write check alone (the defaults)',
        'lost-write check + marker (0.8)',
        'marker alone (0.8)',
      ].map((defences) => failover('partly', defences)),
    );
    // Without the check, the promoted replica's lower count admits the lost admissions again.
    expect(none.before + none.after).toBe(LIMIT + UNREPLICATED);
    // The marker is a key of the master's: lost with it, it resumes nothing.
    expect(marker.before + marker.after).toBe(LIMIT + UNREPLICATED);
    // The check decides on the count it saw: the window admits its limit, no more.
    expect(check.before + check.after).toBe(LIMIT);
    expect(both.before + both.after).toBe(LIMIT);
  }, 150_000);

  it('the replica lacked the whole window: no defence can tell it from a new one; the marker adds nothing', async () => {
    const [check, both] = await Promise.all(
      ['lost-write check alone (the defaults)', 'lost-write check + marker (0.8)'].map((defences) =>
        failover('none', defences),
      ),
    );
    // The promoted replica starts a new window (a start the check never saw): the lost admissions
    // are admitted again, with or without the marker, and no more than that.
    for (const { before, after } of [check, both]) {
      expect(before).toBe(UNREPLICATED);
      expect(after).toBe(LIMIT);
    }
  }, 150_000);
});

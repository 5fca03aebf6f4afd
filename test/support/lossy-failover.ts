import { Controller, Get, type INestApplication, type Type } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, type RateLimitModuleOptions, type RateLimitOptions } from 'nest-rate-limit';
import type { RateLimitAlgorithmName } from 'nest-rate-limit/store';
import { until } from './poll.js';
import type { RedisCluster, RedisSentinelSet, RedisServer } from './redis-server.js';
import { createTestApp } from './test-app.js';
import { type Answer, type Traffic, sequential } from './traffic.js';

/**
 * A real failover that loses the last writes: a master acknowledges admissions its replica never
 * receives (the replica's replication cut for good), the master is killed (SIGKILL), the replica is
 * promoted, and the app's client follows it there. Then more is offered, in the same window of the
 * rule: what the limiter admits then is what its failover defences hold.
 */

/** A master and its replica, on whatever topology promotes one over the other. */
export interface PromotablePair {
  /** Acknowledges the writes, and is killed with the last of them. */
  readonly master: RedisServer;
  readonly replica: RedisServer;
  /** Cuts the replica's replication for good, leaving it fit to be promoted. */
  cut(): Promise<void>;
  /** Resolves once the replica is promoted (called after the kill). */
  promoted(): Promise<void>;
}

/**
 * The pair of a Sentinel set: the replica cut with `REPLICAOF NO ONE`, promoted once the sentinels
 * announce it (`+switch-master`, subscribed to here, before anything is killed).
 */
export async function sentinelPair(set: RedisSentinelSet): Promise<PromotablePair> {
  const sentinel = set.sentinels[0].client();
  const switched = new Promise<void>((resolve) => sentinel.once('message', () => resolve()));
  await sentinel.subscribe('+switch-master');
  return {
    master: set.master,
    replica: set.replica,
    cut: async () => {
      await set.replica.client().replicaof('NO', 'ONE');
    },
    promoted: () => switched,
  };
}

/**
 * The pair of a Cluster's shard that holds `key`. The replica is cut off by credentials its master
 * refuses (a cluster node cannot leave replication by `REPLICAOF`), and stays eligible for promotion
 * however long its link has been down (validity factor 0); it is promoted once the other masters
 * have agreed its master failed (the node timeout, then an election).
 */
export async function clusterPair(cluster: RedisCluster, key: string): Promise<PromotablePair> {
  const slot = Number(await cluster.nodes[0].client().call('CLUSTER', 'KEYSLOT', key));
  const shard = Math.floor(slot / Math.ceil(16384 / cluster.nodes.length));
  const [master, replica] = [cluster.nodes[shard], cluster.replicas[shard]];
  const link = replica.client();
  return {
    master,
    replica,
    cut: async () => {
      await link.config('SET', 'cluster-replica-validity-factor', '0');
      await link.config('SET', 'masteruser', 'not-a-user');
      await link.config('SET', 'masterauth', 'not-a-password');
      await link.call('CLIENT', 'KILL', 'TYPE', 'master');
    },
    promoted: () =>
      until(async () => ((await link.call('ROLE')) as string[])[0] === 'master', {
        // The 2 s node timeout and an election: seconds, more on a busy machine.
        timeoutMs: 30_000,
        intervalMs: 50,
        what: 'the Cluster promoting the replica',
      }),
  };
}

/** What a lossy failover admitted, phase by phase. */
export interface LossyFailover {
  /** Admitted on the master and confirmed by the replica (`WAIT`), before the cut. */
  replicated: Traffic;
  /** Admitted on the master alone after the cut: lost with it. */
  unreplicated: Traffic;
  /** With `offeredWhileOut`: the route's requests from the kill until Redis decided one again (`failed`: 5xx). */
  whileOut: { offered: number; admitted: number; byFallback: number; failed: number };
  /** Offered once Redis decides again, on the promoted replica. */
  after: Traffic;
  /** When each request admitted in these phases was sent, in order: ms on `Date.now()`'s clock. */
  admittedAt: number[];
}

/**
 * Runs the failover: `replicated` requests (confirmed on the replica), the cut, `unreplicated`
 * more, `beforeKill` (what a test checks of the two servers while only the master holds the last
 * admissions; given how many were admitted), the kill, a request every 50 ms until Redis decides
 * one again (on the promoted replica: `promoted` must have resolved), then `offered` requests. Those requests while Redis is out are the
 * measured route's with `offeredWhileOut` (the store-error policy decides them), else `probe`'s (a
 * request of another counter on the same master, so the one measured is untouched meanwhile).
 * Requests are made one after another, each once the previous one is answered.
 */
export async function failOverLosingWrites(
  pair: PromotablePair,
  {
    send,
    probe,
    replicated,
    unreplicated,
    offered,
    offeredWhileOut = false,
    beforeKill,
  }: {
    send: () => PromiseLike<Answer>;
    probe: () => PromiseLike<Answer>;
    replicated: number;
    unreplicated: number;
    offered: number;
    offeredWhileOut?: boolean;
    beforeKill?: (master: Redis, replica: Redis, admitted: number) => Promise<void>;
  },
): Promise<LossyFailover> {
  const admittedAt: number[] = [];
  const now = () => performance.timeOrigin + performance.now();
  const run = async (count: number) => {
    const started = now();
    const traffic = await sequential(count, send);
    admittedAt.push(...traffic.samples.filter((s) => s.status === 200).map((s) => started + s.sentAt));
    return traffic;
  };
  const master = pair.master.client();
  const replica = pair.replica.client();

  const first = await run(replicated);
  if (replicated > 0) {
    const confirmed = await master.call('WAIT', '1', '5000');
    if (confirmed !== 1) throw new Error(`the replica confirmed the first admissions to ${String(confirmed)} of 1`);
  }
  await pair.cut();
  const second = await run(unreplicated);
  await beforeKill?.(master, replica, admittedAt.length);

  await pair.master.kill();
  // The client follows the promotion; until it does, requests are decided by the store-error policy.
  const whileOut = { offered: 0, admitted: 0, byFallback: 0, failed: 0 };
  await until(
    async () => {
      const sentAt = now();
      const answer = await (offeredWhileOut ? send() : probe());
      const fromRedis = answer.headers['ratelimit-limit'] !== undefined;
      if (offeredWhileOut) {
        whileOut.offered += 1;
        if (answer.status >= 500) whileOut.failed += 1;
        if (answer.status === 200) {
          whileOut.admitted += 1;
          if (!fromRedis) whileOut.byFallback += 1;
          admittedAt.push(sentAt);
        }
      }
      return fromRedis;
    },
    // Seconds on an idle machine; a busy one may delay the election.
    { timeoutMs: 30_000, intervalMs: 50, what: 'Redis deciding again, on the promoted replica' },
  );
  // Decided on the replica, promoted, and on no other server.
  await pair.promoted();
  return { replicated: first, unreplicated: second, whileOut, after: await run(offered), admittedAt };
}

/** The rule measured in a lossy failover, on route `/failover/route`, by `'global'`. */
export interface MeasuredRule {
  count: number;
  window: RateLimitOptions['window'];
  algorithm?: RateLimitAlgorithmName;
}

/** The routes of a lossy failover: `route` with the rule measured, `probe` with another counter. */
function failoverController({ count, window, algorithm }: MeasuredRule): Type {
  @Controller('failover')
  class FailoverController {
    @Get('route')
    @RateLimit({ name: 'route', count, window, by: 'global', algorithm })
    route() {
      return {};
    }

    /** Another counter, in the same slot, to tell when Redis decides again without touching the one measured. */
    @Get('probe')
    @RateLimit({ name: 'probe', count: 10_000, window, by: 'global' })
    probe() {
      return {};
    }
  }
  return FailoverController;
}

/** One app instance with the routes of a lossy failover, and how to call them. */
export interface FailoverApp {
  app: INestApplication;
  send: () => PromiseLike<Answer>;
  probe: () => PromiseLike<Answer>;
}

/** An app limiting `/failover/route` by `rule`, on `redis`, with the failover defences given. */
export async function failoverApp(
  rule: MeasuredRule,
  options: Pick<RateLimitModuleOptions, 'redis' | 'keyPrefix' | 'failover'>,
): Promise<FailoverApp> {
  const app = await createTestApp({
    controllers: [failoverController(rule)],
    rateLimit: {
      ...options,
      // The defences alone: the block cache would refuse a full window's requests before Redis is
      // asked, and a deadline missed on a busy machine (several sets of servers run side by side)
      // would hand requests to the store-error policy.
      blockCache: false,
      storeErrors: { timeoutMs: 2_000 },
    },
  });
  const http = () => request(app.getHttpServer());
  return { app, send: () => http().get('/failover/route'), probe: () => http().get('/failover/probe') };
}

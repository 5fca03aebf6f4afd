import type { Provider } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { StoreProblemLog } from '../logging/store-problem-log.js';
import { LostWriteCheck } from '../redis/failover/lost-write-check.js';
import { LostWriteCheckSwitch } from '../redis/failover/lost-write-check-switch.js';
import { ReplicaWait } from '../redis/failover/replica-wait.js';
import { IoredisNotInstalledError, redisConnection } from '../redis/redis-connection.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { LOG_SAMPLING } from './defaults.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from './options.js';

/*
 * The module's providers of the store and of `RedisService`: the connection (the client, whether the
 * start checks the ACL) made in `RedisService`'s provider, the store (Redis with its failover
 * defences, or another) with the switch of the lost-write check, and the store's problem log.
 */

/**
 * The store's problem log of each module instance, made with its Redis connection (whose socket
 * errors it reports) and shared by the store, the layers around it and the limiter, which closes it.
 * Held beside the `RedisService` it was made with: one per app, whichever providers ask.
 */
const problemLogs = new WeakMap<RedisService, StoreProblemLog>();

/** The problem log made with this `RedisService` (see `problemLogs`). */
export function storeProblemLog(redis: RedisService): StoreProblemLog {
  let problems = problemLogs.get(redis);
  if (!problems) problemLogs.set(redis, (problems = new StoreProblemLog(LOG_SAMPLING.intervalMs)));
  return problems;
}

/**
 * `RedisService`, with the Redis client the `redis` option asks for: ioredis is loaded only then,
 * so an app on the embedded store (or its own `store`) runs without it installed.
 */
export const redisServiceProvider: Provider = {
  provide: RedisService,
  inject: [RESOLVED_RATE_LIMIT_OPTIONS, RateLimitRuleRegistry],
  useFactory: async (options: ResolvedRateLimitOptions, rules: RateLimitRuleRegistry) => {
    const problems = new StoreProblemLog(LOG_SAMPLING.intervalMs);
    const connection = await redisConnection(options.redis, problems).catch((error: unknown) => {
      throw error instanceof IoredisNotInstalledError ? new RateLimitConfigurationError(error.message) : error;
    });
    // The start checks that the Redis user may run what the scripts run in an app that declares
    // rules; an operator's tool (the CLI, run by a read-only user perhaps) runs what its user may.
    const redis = new RedisService(
      options,
      connection && { ...connection, checksAccess: () => rules.all().length > 0 },
    );
    problemLogs.set(redis, problems);
    return redis;
  },
};

/**
 * The store itself: yours, the in-process one, or Redis with the failover defences the options
 * ask for (the lost-write check, the marker, the replica wait; `redis/failover/`).
 * `failover.detectLostWrites: 'auto'` (the default) on the Redis store: the lost-write check is
 * turned on once a replica can be promoted (Sentinel, Cluster, a server reporting replicas), by a
 * switch that starts and stops with the store (Nest runs the hooks of what a factory returns).
 */
export const storeProvider: Provider = {
  provide: RateLimitStore,
  inject: [RESOLVED_RATE_LIMIT_OPTIONS, RedisService, ModuleRef],
  useFactory: async (
    options: ResolvedRateLimitOptions,
    redis: RedisService,
    moduleRef: ModuleRef,
  ): Promise<RateLimitStore> => {
    const { store } = options;
    if (store instanceof RateLimitStore) return store;
    if (typeof store === 'function') return moduleRef.create(store);
    const { maxKeys } = options.memoryStore;
    if (!redis.isConfigured) return new MemoryRateLimitStore(maxKeys);
    const problems = storeProblemLog(redis);
    const { detectLostWrites, marker, waitForReplicas } = options.failover;
    const redisStore = new RedisRateLimitStore(redis, problems, {
      // 'auto': turned on later, if ever, by the switch below.
      lostWrites: detectLostWrites === true ? new LostWriteCheck(maxKeys, problems) : undefined,
      marker,
      replicaWait: waitForReplicas ? new ReplicaWait(redis, waitForReplicas, problems) : undefined,
    });
    if (detectLostWrites !== 'auto') return redisStore;
    const lostWrites = new LostWriteCheckSwitch(redis, () =>
      redisStore.checkLostWrites(new LostWriteCheck(maxKeys, problems)),
    );
    return Object.assign(redisStore, {
      onApplicationBootstrap: () => lostWrites.onApplicationBootstrap(),
      onApplicationShutdown: () => lostWrites.onApplicationShutdown(),
    });
  },
};

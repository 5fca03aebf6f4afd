import type { Provider } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import { StoreProblemLog } from '../logging/store-problem-log.js';
import { LostWriteCheck } from '../redis/failover/lost-write-check.js';
import { LostWriteCheckSwitch } from '../redis/failover/lost-write-check-switch.js';
import { ReplicaWait } from '../redis/failover/replica-wait.js';
import { IoredisNotInstalledError, REDIS_CONNECTION, redisConnection } from '../redis/redis-connection.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { RATE_LIMIT_OPTIONS } from './module-definition.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type RateLimitModuleOptions, type ResolvedRateLimitOptions } from './options.js';

/*
 * The module's providers of the store and of what `RedisService` is made from: the client, whether
 * the start checks the ACL, the store (Redis with its failover defences, or another), and the
 * switch of the lost-write check.
 */

/**
 * The Redis client the `redis` option asks for, made before `RedisService`: ioredis is loaded only
 * then, so an app on the embedded store (or its own `store`) runs without it installed.
 */
export const redisConnectionProvider: Provider = {
  provide: REDIS_CONNECTION,
  inject: [RATE_LIMIT_OPTIONS, StoreProblemLog, RateLimitRuleRegistry],
  useFactory: async ({ redis }: RateLimitModuleOptions, problems: StoreProblemLog, rules: RateLimitRuleRegistry) => {
    const connection = await redisConnection(redis, problems).catch((error: unknown) => {
      throw error instanceof IoredisNotInstalledError ? new RateLimitConfigurationError(error.message) : error;
    });
    // The start checks that the Redis user may run what the scripts run in an app that declares
    // rules; an operator's tool (the CLI, run by a read-only user perhaps) runs what its user may.
    return connection && { ...connection, checksAccess: () => rules.all().length > 0 };
  },
};

/**
 * The store itself: yours, the in-process one, or Redis with the failover defences the options
 * ask for (the lost-write check, the marker, the replica wait; `redis/failover/`).
 */
export const storeProvider: Provider = {
  provide: RateLimitStore,
  inject: [RATE_LIMIT_OPTIONS, RESOLVED_RATE_LIMIT_OPTIONS, RedisService, StoreProblemLog, ModuleRef],
  useFactory: async (
    { store }: RateLimitModuleOptions,
    options: ResolvedRateLimitOptions,
    redis: RedisService,
    problems: StoreProblemLog,
    moduleRef: ModuleRef,
  ): Promise<RateLimitStore> => {
    if (store instanceof RateLimitStore) return store;
    if (typeof store === 'function') return moduleRef.create(store);
    const { maxKeys } = options.memoryStore;
    if (!redis.isConfigured) return new MemoryRateLimitStore(maxKeys);
    const { detectLostWrites, marker, waitForReplicas } = options.failover;
    return new RedisRateLimitStore(redis, problems, {
      // 'auto': turned on later, if ever, by `lostWriteCheckSwitchProvider`.
      lostWrites: detectLostWrites === true ? new LostWriteCheck(maxKeys, problems) : undefined,
      marker,
      replicaWait: waitForReplicas ? new ReplicaWait(redis, waitForReplicas, problems) : undefined,
    });
  },
};

/**
 * `failover.detectLostWrites: 'auto'` (the default) on the Redis store: the lost-write check turned
 * on once a replica can be promoted (Sentinel, Cluster, a server reporting replicas). Null otherwise.
 */
export const lostWriteCheckSwitchProvider: Provider = {
  provide: LostWriteCheckSwitch,
  inject: [RateLimitStore, RESOLVED_RATE_LIMIT_OPTIONS, RedisService, StoreProblemLog],
  useFactory: (
    store: RateLimitStore,
    { failover, memoryStore }: ResolvedRateLimitOptions,
    redis: RedisService,
    problems: StoreProblemLog,
  ): LostWriteCheckSwitch | null =>
    failover.detectLostWrites === 'auto' && store instanceof RedisRateLimitStore
      ? new LostWriteCheckSwitch(redis, () => store.checkLostWrites(new LostWriteCheck(memoryStore.maxKeys, problems)))
      : null,
};

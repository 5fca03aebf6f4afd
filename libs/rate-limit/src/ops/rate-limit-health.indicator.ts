import { Injectable } from '@nestjs/common';
import { RateLimitKeyAudit } from './rate-limit-key-audit.js';
import { RedisConfigCentre } from '../live/redis-config-centre.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import type { CircuitBreakerState } from '../redis/call-safety.js';
import type { RedisMemoryState } from '../redis/redis-memory.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { MemoryRateLimitStore } from '../store/memory-rate-limit.store.js';
import { RateLimitStore } from '../store/rate-limit-store.js';

/** What `RateLimitHealthIndicator.isHealthy` reports under its key. */
export interface RateLimitHealth {
  /**
   * `'down'`: Redis does not answer, or the circuit breaker is open (requests are decided by the
   * store-error policy). `'degraded'`: Redis answers, but the live limits may miss changes, a key
   * without a TTL was found, Redis evicted keys since the last check under an evicting
   * `maxmemory-policy` (counters may be lost), or Redis had lost bans, overrides or live limits
   * since the last check, or still lacks some this instance could not write back. `'up'`: none of these.
   */
  status: 'up' | 'degraded' | 'down';
  /**
   * The store counters live in: `'redis'` (the library's Redis store), `'memory'` (in this process),
   * or a store of your own's `description`.
   */
  store: string;
  redis?: 'up' | 'down';
  breaker?: CircuitBreakerState;
  /**
   * Whether Redis has every script of the limiter cached (SCRIPT EXISTS); `'unknown'` when it could
   * not be asked: Redis did not answer within the call deadline (down, hung, unreachable). A
   * script it lacks costs one `EVAL` on the next call, so `false` is no failure.
   */
  scriptsLoaded?: boolean | 'unknown';
  /** `RedisConfigCentre` only: whether news of every change reaches this instance. */
  liveConfigInSync?: boolean;
  /**
   * `RedisConfigCentre` only, once it happened: the times this instance found Redis without bans,
   * overrides or live limits it held (restarted empty, evicted) and wrote them back, the last
   * (ISO 8601), and whether the last write-back succeeded.
   */
  liveControlsLost?: { times: number; last?: string; writtenBack: boolean };
  /** Keys without a TTL at the last background audit (`keyAudit.intervalMs`); absent until one ran. */
  keysWithoutTtl?: number;
  /** Redis's `maxmemory` (bytes; 0: none) and `maxmemory-policy`, its `evicted_keys`, and whether it evicted since the last check. */
  memory?: RedisMemoryState;
}

/**
 * A health indicator for `@nestjs/terminus` (which it does not import: its results are plain
 * objects of terminus's shape), or any health endpoint:
 *
 * ```ts
 * @Get('health') @HealthCheck()
 * check() { return this.health.check([() => this.rateLimit.isHealthy()]); }
 * ```
 *
 * Asks Redis (PING, SCRIPT EXISTS, INFO memory and stats) within the call deadline; the key audit runs in the
 * background, started by the first check, never per check.
 */
@Injectable()
export class RateLimitHealthIndicator {
  /** @internal Nest creates it. */
  constructor(
    private readonly redis: RedisService,
    private readonly centre: RateLimitConfigCentre,
    private readonly audit: RateLimitKeyAudit,
    private readonly store: RateLimitStore,
  ) {}

  /** Losses of live controls as of the last check: a loss since then degrades the next. */
  private lossesSeen = 0;

  async isHealthy<const Key extends string = 'rate_limit'>(
    key: Key = 'rate_limit' as Key,
  ): Promise<Record<Key, RateLimitHealth>> {
    return { [key]: await this.health() } as Record<Key, RateLimitHealth>;
  }

  private async health(): Promise<RateLimitHealth> {
    // Asked of the store: one of your own is neither Redis nor memory, whatever `redis` says.
    const { store } = this;
    const kind =
      store instanceof RedisRateLimitStore
        ? 'redis'
        : store instanceof MemoryRateLimitStore
          ? 'memory'
          : store.description;
    if (!this.redis.isConfigured) return { status: 'up', store: kind };
    const keysWithoutTtl = this.audit.keysWithoutTtl;
    const { runner, memory: redisMemory } = this.redis;
    const breaker = runner.circuitState;
    const reachable = await this.redis.reachable();
    // Not answered is not a no: a hung Redis still holds its scripts.
    const scriptsLoaded = reachable ? await runner.loaded().catch(() => 'unknown' as const) : 'unknown';
    const memory = reachable ? await redisMemory.check().catch(() => undefined) : undefined;
    const health: RateLimitHealth = {
      status: 'up',
      store: kind,
      redis: reachable ? 'up' : 'down',
      breaker,
      scriptsLoaded,
    };
    let controlsLost = false;
    if (this.centre instanceof RedisConfigCentre) {
      const { inSync, lost } = this.centre.state;
      health.liveConfigInSync = inSync;
      if (lost.times > 0 || !lost.writtenBack) {
        health.liveControlsLost = {
          times: lost.times,
          ...(lost.lastAt === undefined ? {} : { last: new Date(lost.lastAt).toISOString() }),
          writtenBack: lost.writtenBack,
        };
      }
      controlsLost = lost.times > this.lossesSeen || !lost.writtenBack;
      this.lossesSeen = lost.times;
    }
    if (keysWithoutTtl !== undefined) health.keysWithoutTtl = keysWithoutTtl;
    if (memory) health.memory = memory;
    if (!reachable || breaker === 'open') health.status = 'down';
    else if (health.liveConfigInSync === false || (keysWithoutTtl ?? 0) > 0 || memory?.evicting || controlsLost) {
      health.status = 'degraded';
    }
    return health;
  }
}

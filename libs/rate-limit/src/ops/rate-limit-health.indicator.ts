import { Injectable } from '@nestjs/common';
import { KeyAuditSchedule } from './key-audit-schedule.js';
import { RedisConfigCentre } from '../live/redis-config-centre.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import type { CircuitBreakerState } from '../redis/call-safety.js';
import type { RedisMemoryState } from '../redis/redis-memory.js';
import { RedisService } from '../redis/redis.service.js';

/** What `RateLimitHealthIndicator.isHealthy` reports under its key. */
export interface RateLimitHealth {
  /**
   * `'down'`: Redis does not answer, or the circuit breaker is open (requests are decided by the
   * store-error policy). `'degraded'`: Redis answers, but the live limits may miss changes, a key
   * without a TTL was found, or Redis evicted keys since the last check under an evicting
   * `maxmemory-policy` (counters may be lost). `'up'`: none of these.
   */
  status: 'up' | 'degraded' | 'down';
  store: 'redis' | 'memory';
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
    private readonly audit: KeyAuditSchedule,
  ) {}

  async isHealthy<const Key extends string = 'rate_limit'>(
    key: Key = 'rate_limit' as Key,
  ): Promise<Record<Key, RateLimitHealth>> {
    return { [key]: await this.health() } as Record<Key, RateLimitHealth>;
  }

  private async health(): Promise<RateLimitHealth> {
    if (!this.redis.isConfigured) return { status: 'up', store: 'memory' };
    const keysWithoutTtl = this.audit.keysWithoutTtl;
    const breaker = this.redis.circuitState;
    const reachable = await this.redis.reachable();
    // Not answered is not a no: a hung Redis still holds its scripts.
    const scriptsLoaded = reachable ? await this.redis.scriptsLoaded().catch(() => 'unknown' as const) : 'unknown';
    const memory = reachable ? await this.redis.memoryState().catch(() => undefined) : undefined;
    const health: RateLimitHealth = {
      status: 'up',
      store: 'redis',
      redis: reachable ? 'up' : 'down',
      breaker,
      scriptsLoaded,
    };
    if (this.centre instanceof RedisConfigCentre) health.liveConfigInSync = this.centre.state.inSync;
    if (keysWithoutTtl !== undefined) health.keysWithoutTtl = keysWithoutTtl;
    if (memory) health.memory = memory;
    if (!reachable || breaker === 'open') health.status = 'down';
    else if (health.liveConfigInSync === false || (keysWithoutTtl ?? 0) > 0 || memory?.evicting) {
      health.status = 'degraded';
    }
    return health;
  }
}

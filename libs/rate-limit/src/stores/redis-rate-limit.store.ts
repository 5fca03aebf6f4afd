import { FIXED_WINDOW_SCRIPT } from '../redis/fixed-window.script.js';
import type { RedisService } from '../redis/redis.service.js';
import { RateLimitStore, type RateLimitDecision, type RateLimitHit } from './rate-limit-store.js';

/** Counters in Redis, shared by every instance: one Lua call per decision. */
export class RedisRateLimitStore extends RateLimitStore {
  readonly description: string;

  constructor(private readonly redis: RedisService) {
    super();
    redis.register(FIXED_WINDOW_SCRIPT);
    this.description = `Redis store (${redis.describe()}; shared across instances)`;
  }

  async hit(hit: RateLimitHit): Promise<RateLimitDecision> {
    const [allowed, count, ttl] = (await this.redis.run(
      FIXED_WINDOW_SCRIPT,
      [hit.key],
      [hit.limit, hit.windowMs, hit.cost],
    )) as [number, number, number];
    return {
      allowed: allowed === 1,
      limit: hit.limit,
      remaining: Math.max(0, hit.limit - count),
      resetMs: ttl,
    };
  }
}

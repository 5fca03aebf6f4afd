import { randomBytes } from 'node:crypto';
import { CONSUME_SCRIPT } from '../redis/consume.script.js';
import type { RedisService } from '../redis/redis.service.js';
import { RateLimitStore, type RateLimitConsumption, type RateLimitHit } from './rate-limit-store.js';

/** Unique per process; with a per-call sequence it makes every request's nonce unique. */
const PROCESS_NONCE = randomBytes(6).toString('base64url');

/** Counters in Redis, shared by every instance: all rules of a request in one Lua call. */
export class RedisRateLimitStore extends RateLimitStore {
  readonly description: string;
  private sequence = 0;

  constructor(private readonly redis: RedisService) {
    super();
    redis.register(CONSUME_SCRIPT);
    this.description = `Redis store (${redis.describe()}; shared across instances)`;
  }

  async consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    const keys: string[] = [];
    const args: (string | number)[] = [now ?? -1, `${PROCESS_NONCE}${(this.sequence++).toString(36)}`, hits.length];
    for (const hit of hits) {
      keys.push(hit.key, hit.blockKey);
      args.push(hit.algorithm, hit.limit, hit.windowMs, hit.cost, hit.burst, hit.blockMs);
    }
    const reply = (await this.redis.run(CONSUME_SCRIPT, keys, args)) as number[];
    return {
      allowed: reply[0] === 1,
      decisions: hits.map((hit, i) => ({
        allowed: reply[2 + i * 3] === 1,
        limit: hit.limit,
        remaining: reply[3 + i * 3],
        resetMs: reply[4 + i * 3],
      })),
    };
  }
}

import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';

/** One change made through `RateLimitManagementService`: what, to what, by whom and when. */
export interface RateLimitChange {
  /** ISO 8601, on the clock of the instance that made it. */
  at: string;
  /** Who made it, as the caller named them (`{ by }`): the CLI's user, an admin endpoint's caller. */
  by: string;
  change: 'set' | 'delete' | 'reset' | 'ban' | 'unban' | 'set-override' | 'delete-override';
  /** `set`, `delete`, `set-override`, `delete-override`: the config key. */
  configKey?: string;
  /** `set`, `set-override`: the values written. */
  values?: Record<string, unknown>;
  /** `reset`, `ban`, `unban`: the rules (`'*'`: every rule). */
  rules?: string[];
  /** `reset`, `ban`, `unban`, `set-override`, `delete-override`: the identity. */
  identity?: string;
  /** `ban`, `set-override`: when it ends (ISO 8601). */
  until?: string;
}

/** Changes kept, newest first: a few months of an operator's changes, a few hundred KB at most. */
const CHANGE_LOG_MAX = 1_000;
/** The log goes when no change was made for this long: no key without a TTL. */
const CHANGE_LOG_TTL_MS = 90 * 24 * 3_600_000;

/**
 * The log of live changes, bounded: in Redis (a list beside the live limits, `<prefix>:config:changes`)
 * where the limits are shared, so every instance and the CLI read one log; in this process otherwise.
 */
export class ChangeLog {
  private readonly key: string;
  /** Without Redis: the changes of this process. */
  private readonly local: RateLimitChange[] = [];

  constructor(
    private readonly redis: RedisService | undefined,
    keyPrefix: string,
  ) {
    this.key = liveConfigKeys(keyPrefix).changes;
  }

  /** Appends a change. Rejects when Redis refuses it (a user without LPUSH on the key, say). */
  async record(change: RateLimitChange): Promise<void> {
    if (!this.redis) {
      this.local.unshift(change);
      this.local.length = Math.min(this.local.length, CHANGE_LOG_MAX);
      return;
    }
    await this.redis.runner.operation(
      (client) =>
        client
          .multi()
          .lpush(this.key, JSON.stringify(change))
          .ltrim(this.key, 0, CHANGE_LOG_MAX - 1)
          .pexpire(this.key, CHANGE_LOG_TTL_MS)
          .exec()
          .then(
            (results) => {
              const failed = results?.find(([error]) => error);
              if (failed) throw failed[0];
            },
            // A command refused while queued (NOPERM) aborts the transaction: say which.
            (error: Error & { previousErrors?: Error[] }) => {
              throw error.previousErrors?.[0] ?? error;
            },
          ),
      'MULTI',
    );
  }

  /** The latest `count` changes, newest first. */
  async latest(count: number): Promise<RateLimitChange[]> {
    if (!this.redis) return this.local.slice(0, count);
    const texts = await this.redis.runner.operation((client) => client.lrange(this.key, 0, count - 1), 'LRANGE');
    return texts.flatMap((text) => {
      try {
        return [JSON.parse(text) as RateLimitChange];
      } catch {
        return []; // written by hand
      }
    });
  }
}

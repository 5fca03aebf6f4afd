import { RedisScript } from '../redis/script-runner.js';
import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { DELETED } from './lost-controls.js';

/** How long an operator's write waits for a replica to have it. */
const REPLICA_CONFIRM_MS = 1_000;

/** What a call that met a hash of live limits of another type did. */
export const UNUSABLE = 'nothing was read or written';

/** Fields one HSCAN call looks at when keys are listed (`fields`). */
const SCAN_COUNT = 100;

/**
 * Writes a key's values (or deletes them, given none) and announces the key, in one atomic call.
 * A delete leaves a mark (a field `~deleted:<key>`, which a write of the key takes away), so that
 * an instance still holding the values never writes them back (`LostControls`). Replies with the
 * number of values deleted (0 when there were none), or 1 for a write; or, when the key holds
 * something other than a hash, with that type's name, writing and announcing nothing.
 */
const WRITE_SCRIPT = new RedisScript(
  'config-write',
  `
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then return kind end
local changed = 1
local mark = '${DELETED}' .. ARGV[1]
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[1], mark, '1')
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HDEL', KEYS[1], mark)
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return changed
`,
);

/**
 * The hash of live limits in Redis, `<keyPrefix>:config` (a field per config key, its values as
 * JSON text), and the channel every write to it is announced on: the Redis commands
 * `RedisConfigCentre` reads, lists and writes it with, and what a key of another type in its place
 * means. Apart from the centre, which holds what it reads and keeps it in step, so that what is
 * asked of Redis, and what each refusal of it says, can be read in one place.
 */
export class LiveLimitsHash {
  /** The hash's Redis key. */
  readonly key: string;
  /** The channel writes are announced on, a config key per message. */
  readonly channel: string;

  constructor(
    private readonly redis: RedisService,
    keyPrefix: string,
  ) {
    const keys = liveConfigKeys(keyPrefix);
    this.key = keys.hash;
    this.channel = keys.channel;
  }

  /**
   * The texts of these keys (null: none), in their order. With no key to read, HLEN still tells
   * whether the hash can be read at all. A key of another type in the hash's place fails with the
   * error that names it, and `consequence`.
   */
  async texts(configKeys: readonly string[], consequence: string): Promise<(string | null)[]> {
    try {
      // HMGET of the keys asked for, never the whole hash: the cost is theirs, whatever else it holds.
      return configKeys.length > 0
        ? await this.redis.runner.operation((client) => client.hmget(this.key, ...configKeys), 'HMGET')
        : (await this.redis.runner.operation((client) => client.hlen(this.key), 'HLEN'), []);
    } catch (error) {
      throw await this.explained(error, consequence);
    }
  }

  /** One key's text (null: none); Redis's error as it came (see `isWrongType`). */
  text(configKey: string): Promise<string | null> {
    return this.redis.runner.operation((client) => client.hget(this.key, configKey), 'HGET');
  }

  /** Up to `max` keys with values written: a few calls of SCAN_COUNT fields each, whatever the hash holds. */
  async fields(max: number): Promise<string[]> {
    const found = new Set<string>();
    let cursor = '0';
    for (let calls = 0; calls <= Math.ceil(max / SCAN_COUNT) && found.size < max; calls += 1) {
      let fields: string[];
      try {
        [cursor, fields] = await this.redis.runner.operation(
          (client) => client.hscan(this.key, cursor, 'COUNT', SCAN_COUNT),
          'HSCAN',
        );
      } catch (error) {
        throw await this.explained(error, UNUSABLE);
      }
      // A field starting with `~` is a mark (DELETED), not a config key.
      for (let i = 0; i < fields.length && found.size < max; i += 2) if (fields[i][0] !== '~') found.add(fields[i]);
      if (cursor === '0') break;
    }
    return [...found];
  }

  /**
   * Writes a key's text (or deletes it, given '') and announces the key; resolves once a replica
   * has it where there are replicas (see `Replicas.toConfirm`): a write a failover could
   * still lose is reported as failed, to be checked and made again. Resolves to what the script
   * replied: 1 for a write, the number of values deleted for a delete.
   */
  async put(configKey: string, text: string): Promise<number> {
    const reply = await this.redis.runner.runOperation(WRITE_SCRIPT, [this.key], [configKey, text, this.channel]);
    if (typeof reply === 'string') throw this.wrongType(reply, UNUSABLE);
    await this.confirmReplicated(configKey);
    return reply as number;
  }

  private async confirmReplicated(configKey: string): Promise<void> {
    const replicas = await this.redis.replicas.toConfirm();
    if (replicas === 0) return;
    if ((await this.redis.replicas.wait(replicas, REPLICA_CONFIRM_MS)) >= replicas) return;
    throw new Error(
      `The limits of '${configKey}' were written, but no replica confirmed them within ${REPLICA_CONFIRM_MS} ms (a failover under way?): a failover could still lose them; check them with get, and write them again`,
    );
  }

  /** `error`, or when it is Redis's WRONGTYPE, the error that names the key and what it holds. */
  private async explained(error: unknown, consequence: string): Promise<unknown> {
    if (!isWrongType(error)) return error;
    const type = await this.redis.runner
      .operation((client) => client.type(this.key), 'TYPE')
      .catch(() => 'value of another type');
    return this.wrongType(type, consequence);
  }

  private wrongType(type: string, consequence: string): RateLimitConfigurationError {
    return new RateLimitConfigurationError(
      `Redis key '${this.key}' holds a ${type}, not the hash of live limits: ${consequence}; delete it (or choose another keyPrefix) and write the limits again`,
    );
  }
}

/** Redis's reply to a hash command on a key of another type. */
export function isWrongType(error: unknown): boolean {
  return error instanceof Error && error.message.includes('WRONGTYPE');
}

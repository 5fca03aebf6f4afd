import type { SampledLogger } from '../logging/sampled-logger.js';
import type { RedisService } from '../redis/redis.service.js';
import { RedisScript } from '../redis/script-runner.js';

/**
 * Starts the member of a set of bans or overrides that says an identity's entry was lifted (then the
 * entry as stored, `["scope","identity"]`), its score when the lifted entry would have ended. No
 * entry starts with `~`, and versions that do not know it skip it as a member written by hand.
 */
export const LIFTED = '~lifted';

/** Starts the field of the hash of live limits that says a config key's values were deleted (then the key). */
export const DELETED = '~deleted:';

/** An entry this instance holds, as its set stores it. */
export interface HeldEntry {
  scope: string;
  identity: string;
  /** The member as written: `JSON.stringify([scope, identity, values?])`. */
  member: string;
  /** When it ends, in ms on the module's clock. */
  until: number;
}

/** What a health check asks of the controls Redis lost. */
export interface LostControlsState {
  /** Times this instance found Redis without bans, overrides or live limits it held, and wrote them back. */
  times: number;
  /** When it last did (ms since the epoch), or undefined. */
  lastAt: number | undefined;
  /** False while the last write-back failed: Redis lacks controls this instance holds. */
  writtenBack: boolean;
}

/**
 * What an instance does when Redis lost the controls it holds (bans, overrides, live limits):
 * restarted without persistence, failed over to a replica without them, evicted under an evicting
 * `maxmemory-policy`, deleted by hand. Every instance holds them in memory and reads them again
 * every `liveConfig.refreshMs`; where that read lacks what it holds, it asks this to write back,
 * before it takes what Redis holds. A write-back writes what Redis has no entry of, and no lift or
 * delete of since (each leaves a mark beside the entries: `LIFTED`, `DELETED`), in one script per
 * key, so a lift made by another instance, before or after, stays lifted whatever the order; an
 * entry Redis holds is newer than the one held here, and stays. Entries go back with what is left
 * of their time. Each write-back that wrote anything is a loss: logged (sampled: a line, then a
 * count per interval) and counted for health. No call per request: only the periodic read, and a
 * script when it lacks something.
 */
export class LostControls {
  private times = 0;
  private lastAt: number | undefined;
  private writtenBack = true;

  constructor(
    private readonly redis: RedisService,
    private readonly log: SampledLogger,
    private readonly clock: () => number,
  ) {}

  get state(): LostControlsState {
    return { times: this.times, lastAt: this.lastAt, writtenBack: this.writtenBack };
  }

  /**
   * Writes back the entries (bans or overrides) held here that the set lacks, unless lifted since;
   * resolves with how many it wrote.
   */
  async restoreEntries(kind: 'bans' | 'overrides', key: string, held: readonly HeldEntry[]): Promise<number> {
    const now = this.clock();
    const live = held.filter((entry) => entry.until > now);
    if (live.length === 0) return 0;
    const args = live.flatMap(({ scope, identity, member, until }) => [until, member, scope, identity]);
    const written = await this.guarded(this.redis.runner.runOperation(RESTORE_ENTRIES_SCRIPT, [key], [now, ...args]));
    this.found(written, kind === 'bans' ? 'ban' : 'override', key);
    return written;
  }

  /**
   * Writes back the live limits held here (config key, its text as last read) that the hash lacks,
   * unless deleted since, announcing each; resolves with how many it wrote.
   */
  async restoreLimits(key: string, channel: string, held: readonly [string, string][]): Promise<number> {
    if (held.length === 0) return 0;
    const written = await this.guarded(
      this.redis.runner.runOperation(RESTORE_LIMITS_SCRIPT, [key], [channel, ...held.flat()]),
    );
    this.found(written, 'live limit', key);
    return written;
  }

  private async guarded(call: Promise<unknown>): Promise<number> {
    try {
      const written = Number(await call);
      this.writtenBack = true;
      return written;
    } catch (error) {
      this.writtenBack = false;
      throw error;
    }
  }

  private found(written: number, what: string, key: string): void {
    if (written <= 0) return;
    this.times += 1;
    this.lastAt = Date.now();
    this.log.record(
      `lost:${key}`,
      `Redis had lost ${what}s this instance held ('${key}': restarted without persistence, evicted, or deleted by hand); they were written back with what is left of their time. Write-backs`,
    );
  }
}

/**
 * Writes back entries an instance holds that the set has none of, for their identity: not one
 * lifted since (a `LIFTED` member in force), not one Redis holds an entry of (written since, and
 * newer). Drops what ended first; keeps the set until its last member ends. Returns how many it wrote.
 *
 * KEYS[1] the set. ARGV: now (ms), then per entry: when it ends (ms), the member, its scope, its identity.
 */
const RESTORE_ENTRIES_SCRIPT = new RedisScript(
  'restore-identity-entries',
  `
local key, now = KEYS[1], tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local taken = {}
for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  local text = member
  if string.sub(member, 1, ${LIFTED.length}) == '${LIFTED}' then text = string.sub(member, ${LIFTED.length + 1}) end
  local ok, entry = pcall(cjson.decode, text)
  if ok and type(entry) == 'table' and type(entry[1]) == 'string' and type(entry[2]) == 'string' then
    taken[entry[1] .. '\\0' .. entry[2]] = true
  end
end
local written, last = 0, 0
for i = 2, #ARGV, 4 do
  local untilMs = tonumber(ARGV[i])
  local identity = ARGV[i + 2] .. '\\0' .. ARGV[i + 3]
  if untilMs > now and not taken[identity] then
    redis.call('ZADD', key, untilMs, ARGV[i + 1])
    taken[identity] = true
    written = written + 1
    if untilMs > last then last = untilMs end
  end
end
if written > 0 then
  local ttl = math.max(1, math.ceil(last - now))
  redis.call('PEXPIRE', key, ttl, 'NX')
  redis.call('PEXPIRE', key, ttl, 'GT')
end
return written
`,
);

/**
 * Writes back live limits an instance holds that the hash has none of: not one deleted since (a
 * `DELETED` field), not one written since (HSETNX). Announces each written. Returns how many it wrote.
 *
 * KEYS[1] the hash. ARGV: the channel, then per key: the config key, its text.
 */
const RESTORE_LIMITS_SCRIPT = new RedisScript(
  'restore-live-limits',
  `
local written = 0
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], '${DELETED}' .. ARGV[i]) == 0 and redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('PUBLISH', ARGV[1], ARGV[i])
    written = written + 1
  end
end
return written
`,
);

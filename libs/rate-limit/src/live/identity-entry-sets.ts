import type { RedisService } from '../redis/redis.service.js';
import { RedisScript } from '../redis/script-runner.js';
import type { FreshEntry } from './ending-entries.js';
import { LIFTED } from './lost-controls.js';

/** The two kinds of entries an identity may have, each in a set of its own. */
export type IdentityEntryKind = 'bans' | 'overrides';

/**
 * The sorted sets in Redis that hold the bans and the overrides beside the live limits
 * (`<prefix>:config:bans`, `<prefix>:config:overrides`): each member an entry as stored,
 * `JSON.stringify([scope, identity, values?])`, its score when it ends. What the instances hold in
 * memory (`IdentityEntries`) is read from here and written here first.
 */
export class IdentityEntrySets {
  /** The key of each kind's set. */
  readonly keys: Readonly<Record<IdentityEntryKind, string>>;

  /**
   * @param hashKey the key of the hash of live limits, which the sets' keys extend.
   * @param maxEntries the most entries in force a set holds, and a read takes.
   */
  constructor(
    private readonly redis: RedisService,
    hashKey: string,
    private readonly maxEntries: number,
  ) {
    this.keys = { bans: `${hashKey}:bans`, overrides: `${hashKey}:overrides` };
  }

  /**
   * Removes the identity's entries of that rule or key from the set, and adds the new one, or marks
   * it lifted, in one script: two writers at once leave one entry, never one each. Resolves with how
   * many it removed, or -1 when the set is full and nothing was changed.
   */
  async replace(
    kind: IdentityEntryKind,
    [scope, identity]: readonly unknown[],
    now: number,
    change: [until: number, member: string, ttlMs: number] | ['lift', heldUntil: number, unknownUntil: number],
  ): Promise<number> {
    // Every member is written by JSON.stringify: the identity's begin with this, then `,` or `]`.
    const entry = JSON.stringify([scope, identity]);
    const reply = await this.redis.runner.runOperation(
      REPLACE_ENTRY_SCRIPT,
      [this.keys[kind]],
      [now, entry.slice(0, -1), this.maxEntries, `${LIFTED}${entry}`, ...change],
    );
    return Number(reply);
  }

  /**
   * The entries of a kind in force after `now`, as stored (an override's values as read, not yet
   * checked; a ban's none), up to the most a set holds. Members written by hand are skipped.
   */
  async read(kind: IdentityEntryKind, now: number): Promise<FreshEntry<unknown>[]> {
    const key = this.keys[kind];
    const reply = await this.redis.runner.operation(
      (client) => client.zrangebyscore(key, `(${now}`, '+inf', 'WITHSCORES'),
      'ZRANGEBYSCORE',
    );
    const fresh: FreshEntry<unknown>[] = [];
    for (let i = 0; i + 1 < reply.length && fresh.length < this.maxEntries; i += 2) {
      const entry = parseEntry(reply[i]);
      const until = Number(reply[i + 1]);
      if (!entry || !Number.isFinite(until)) continue; // written by hand: not an entry
      const [scope, identity, values] = entry;
      fresh.push({ scope, identity, value: kind === 'bans' ? undefined : values, until });
    }
    return fresh;
  }
}

/** An entry as stored: `[rule or config key, identity]`, with an override's values third. */
export function parseEntry(text: string): [string, string, unknown] | undefined {
  try {
    const entry: unknown = JSON.parse(text);
    if (!Array.isArray(entry) || typeof entry[0] !== 'string' || typeof entry[1] !== 'string') return undefined;
    return [entry[0], entry[1], entry[2]];
  } catch {
    return undefined;
  }
}

/**
 * Replaces an identity's entry of a rule or config key in its sorted set, atomically: drops the
 * members that ended, removes the identity's entries (members beginning with ARGV[2], then `,` or
 * `]`), and adds the new one (removing the identity's lift mark, ARGV[4]), unless the set holds
 * ARGV[3] other entries in force (then changes nothing and returns -1); or marks the identity
 * lifted until its entry would have ended: as held by the remover (ARGV[6]) or in the set, and
 * when neither knows, the longest an entry lasts (ARGV[7]), so that no instance holding it writes
 * it back once Redis lost it (`LostControls`). Keeps the set until its last member ends (PEXPIRE
 * NX sets a new set's expiry, GT lengthens it, never shortened under a member that ends later).
 * Returns how many entries of the identity it removed.
 *
 * KEYS[1] the set. ARGV: now (ms), the identity's prefix, the most entries, the identity's lift
 * mark; then to add: when it ends (ms), the member, its TTL (ms); to lift: 'lift', when the entry
 * held ends (0: none held), when an entry no one knows would end.
 */
const REPLACE_ENTRY_SCRIPT = new RedisScript(
  'replace-identity-entry',
  `
local key, prefix, lifted, now = KEYS[1], ARGV[2], ARGV[4], tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local members = redis.call('ZRANGE', key, 0, -1)
local same, entries = {}, 0
for _, member in ipairs(members) do
  if string.sub(member, 1, 1) == '[' then entries = entries + 1 end
  if string.sub(member, 1, #prefix) == prefix then
    local after = string.sub(member, #prefix + 1, #prefix + 1)
    if after == ',' or after == ']' then same[#same + 1] = member end
  end
end
local lifting = ARGV[5] == 'lift'
if not lifting and entries - #same >= tonumber(ARGV[3]) then return -1 end
local ends = 0
for _, member in ipairs(same) do
  ends = math.max(ends, tonumber(redis.call('ZSCORE', key, member)))
  redis.call('ZREM', key, member)
end
local ttl
if lifting then
  ends = math.max(ends, tonumber(ARGV[6]))
  if ends <= now then ends = tonumber(ARGV[7]) end
  redis.call('ZADD', key, 'GT', ends, lifted)
  ttl = math.max(1, math.ceil(ends - now))
else
  redis.call('ZREM', key, lifted)
  redis.call('ZADD', key, ARGV[5], ARGV[6])
  ttl = ARGV[7]
end
redis.call('PEXPIRE', key, ttl, 'NX')
redis.call('PEXPIRE', key, ttl, 'GT')
return #same
`,
);

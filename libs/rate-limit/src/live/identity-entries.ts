import { EVERY_RULE, type IdentityControls, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RedisService } from '../redis/redis.service.js';
import { RedisScript } from '../redis/script-runner.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { MAX_DURATION_MS } from '../rules/duration.js';
import { BannedNetworks } from './banned-networks.js';
import { EndingEntries, type FreshEntry } from './ending-entries.js';
import { type HeldEntry, LIFTED, type LostControls } from './lost-controls.js';

/** A ban: an identity refused by a rule (or every rule, `'*'`) until a time. */
export interface RateLimitBan {
  rule: string;
  identity: string;
  /** ISO 8601. */
  until: string;
}

/** An identity's own thresholds under a config key's rules, until a time. */
export interface RateLimitIdentityOverride {
  configKey: string;
  identity: string;
  values: RateLimitOverride;
  /** ISO 8601. */
  until: string;
}

/**
 * Entries held at most of each kind: bans and overrides are an operator's decisions about single
 * customers or attackers, not a database; a larger list belongs in the app's own data.
 */
export const MAX_IDENTITY_ENTRIES = 10_000;

type Kind = 'bans' | 'overrides';
/**
 * What starts the message announcing a change of each kind on the live limits' channel (no config
 * key starts with `~`): then a space and the entry changed, as stored (`[scope, identity, values?]`),
 * with when it ends (none: removed). Alone, it asks for the whole set to be read (as versions before
 * 0.3 announce every change).
 */
const NEWS: Record<Kind, string> = { bans: '~bans', overrides: '~overrides' };

/**
 * Bans and per-identity overrides, held in memory on every instance (the limiter reads them per
 * request, never the store) and, with Redis, kept in two sorted sets beside the live limits
 * (`<prefix>:config:bans`, `<prefix>:config:overrides`; each member an entry, its score when it
 * ends). Every entry ends: one past its time is neither held nor read (held ones are dropped as
 * soon as a lookup or a write comes after the first of them ends, so they take no room), writes
 * drop those that ended, and each set expires with its last entry, so no key outlives what it
 * holds. A write is announced on the live limits' channel with the entry it changed, which every
 * instance applies to what it holds: in milliseconds, without reading the set (25 to 60 ms at
 * 10,000 entries); what news missed or mixed up, the next periodic read of the whole set
 * (`liveConfig.refreshMs`) mends.
 *
 * A ban of a network (`203.0.113.0/24`, `2001:db8::/48`) holds for every address in it: such bans
 * are indexed by prefix length as well (`BannedNetworks`), so a request is matched against them
 * with one map lookup per prefix length held, however many there are.
 */
export class IdentityEntries implements IdentityControls {
  private readonly networks = new BannedNetworks();
  private readonly bans = new EndingEntries<undefined>(this.networks);
  private readonly overrides = new EndingEntries<RateLimitOverride>();
  private readonly keys: Record<Kind, string> | undefined;
  private readonly channel: string;
  /** Writes back what Redis lost of what this instance holds (`RedisConfigCentre`'s). */
  private lost: LostControls | undefined;

  /**
   * @param redis the shared store of the entries; none: this process holds them alone.
   * @param clock the module's clock (the app's time), which decides when entries end.
   */
  constructor(
    keyPrefix: string,
    private readonly clock: () => number,
    private readonly redis?: RedisService,
  ) {
    const keys = liveConfigKeys(keyPrefix);
    this.channel = keys.channel;
    if (redis) this.keys = { bans: `${keys.hash}:bans`, overrides: `${keys.hash}:overrides` };
  }

  /** From now on, a read that lacks entries held here has them written back first, unless lifted. */
  restoreWith(lost: LostControls): void {
    this.lost = lost;
  }

  get anyBans(): boolean {
    return this.bans.anyHeld(this.clock);
  }

  get anyOverrides(): boolean {
    return this.overrides.anyHeld(this.clock);
  }

  banUntil(rule: string, identity: string, now: number): number | undefined {
    const until = Math.max(
      this.bans.get(rule, identity, now)?.until ?? 0,
      rule === EVERY_RULE ? 0 : (this.bans.get(EVERY_RULE, identity, now)?.until ?? 0),
      // Ended ones were dropped, from the networks too, by the lookups above.
      this.networkBanUntil(rule, identity),
      rule === EVERY_RULE ? 0 : this.networkBanUntil(EVERY_RULE, identity),
    );
    return until > now ? until : undefined;
  }

  /** When the last-ending ban of a network holding the identity ends under the scope; 0: none. */
  private networkBanUntil(scope: string, identity: string): number {
    if (!this.networks.holdsAny(scope)) return 0;
    let until = 0;
    this.networks.forEachHolding(scope, identity, (network) => {
      until = Math.max(until, this.bans.peek(scope, network)?.until ?? 0);
    });
    return until;
  }

  overrideOf(configKey: string, identity: string, now: number): RateLimitOverride | undefined {
    return this.overrides.get(configKey, identity, now)?.value;
  }

  /** Whether news of this kind names these entries: the live limits' channel carries both. */
  isNews(message: string): boolean {
    return kindOf(message) !== undefined;
  }

  /**
   * Applies news of a change: the entry it carries, as the write left it in Redis; news without
   * one (from an earlier version), or that cannot be read, has the kind read again.
   */
  async hear(message: string): Promise<void> {
    const kind = kindOf(message);
    if (!kind) return;
    const change = message.length > NEWS[kind].length ? parseChange(message.slice(NEWS[kind].length + 1)) : undefined;
    if (!change) return this.redis ? this.reloadKind(kind) : undefined;
    const [[scope, identity, values], until] = change;
    if (until === undefined || until <= this.clock()) this.entriesOf(kind).delete(scope, identity);
    else if (kind === 'bans') this.bans.set(scope, identity, undefined, until);
    else this.overrides.set(scope, identity, this.sameOrFrozen(scope, identity, values), until);
  }

  /** Reads both kinds from Redis again (nothing to read without it). */
  async reload(): Promise<void> {
    if (!this.redis) return;
    await Promise.all([this.reloadKind('bans'), this.reloadKind('overrides')]);
  }

  /** The bans in force, from their source. */
  async listBans(): Promise<RateLimitBan[]> {
    await this.reload();
    return this.bans
      .list(this.clock())
      .map(({ scope, identity, until }) => ({ rule: scope, identity, until: new Date(until).toISOString() }));
  }

  async listOverrides(): Promise<RateLimitIdentityOverride[]> {
    await this.reload();
    return this.overrides.list(this.clock()).map(({ scope, identity, value, until }) => ({
      configKey: scope,
      identity,
      values: value,
      until: new Date(until).toISOString(),
    }));
  }

  async ban(rule: string, identity: string, until: number): Promise<void> {
    await this.write('bans', [rule, identity], until, () => this.bans.set(rule, identity, undefined, until));
  }

  async unban(rule: string, identity: string): Promise<boolean> {
    return this.remove('bans', [rule, identity], this.bans.get(rule, identity, this.clock())?.until);
  }

  async setOverride(configKey: string, identity: string, values: RateLimitOverride, until: number): Promise<void> {
    await this.write('overrides', [configKey, identity, values], until, () =>
      this.overrides.set(configKey, identity, Object.freeze({ ...values }), until),
    );
  }

  async deleteOverride(configKey: string, identity: string): Promise<boolean> {
    return this.remove(
      'overrides',
      [configKey, identity],
      this.overrides.get(configKey, identity, this.clock())?.until,
    );
  }

  /**
   * Adds an entry (replacing the identity's entry of that rule or key), drops those that ended,
   * keeps the set until its last entry ends, and announces it. Refused past `MAX_IDENTITY_ENTRIES`
   * entries in force.
   */
  private async write(kind: Kind, member: unknown[], until: number, holdHere: () => void): Promise<void> {
    const now = this.clock();
    if (!this.redis) {
      const entries = this.entriesOf(kind);
      if (entries.count(now) >= MAX_IDENTITY_ENTRIES && !entries.has(member[0] as string, member[1] as string)) {
        throw tooMany(kind);
      }
      holdHere();
      return;
    }
    const ttl = Math.max(1, Math.ceil(until - now));
    const replaced = await this.replaceInRedis(kind, member, now, [until, JSON.stringify(member), ttl]);
    if (replaced < 0) throw tooMany(kind);
    holdHere();
    await this.redis.news.publish(this.channel, `${NEWS[kind]} ${JSON.stringify([member, until])}`);
  }

  /** @param heldUntil when the entry held here ends; none: none is held. */
  private async remove(kind: Kind, member: unknown[], heldUntil: number | undefined): Promise<boolean> {
    const [scope, identity] = member as [string, string];
    if (!this.redis) {
      this.entriesOf(kind).delete(scope, identity);
      return heldUntil !== undefined;
    }
    const now = this.clock();
    const removed = await this.replaceInRedis(kind, member, now, ['lift', heldUntil ?? 0, now + MAX_DURATION_MS]);
    this.entriesOf(kind).delete(scope, identity);
    await this.redis.news.publish(this.channel, `${NEWS[kind]} ${JSON.stringify([[scope, identity]])}`);
    return removed > 0;
  }

  /**
   * Removes the identity's entries of that rule or key from the set, and adds the new one, or marks
   * it lifted, in one script: two writers at once leave one entry, never one each. Resolves with how
   * many it removed, or -1 when the set is full and nothing was changed.
   */
  private async replaceInRedis(
    kind: Kind,
    [scope, identity]: unknown[],
    now: number,
    change: [until: number, member: string, ttlMs: number] | ['lift', heldUntil: number, unknownUntil: number],
  ): Promise<number> {
    // Every member is written by JSON.stringify: the identity's begin with this, then `,` or `]`.
    const entry = JSON.stringify([scope, identity]);
    const reply = await this.redis!.runner.runOperation(
      REPLACE_ENTRY_SCRIPT,
      [this.keys![kind]],
      [now, entry.slice(0, -1), MAX_IDENTITY_ENTRIES, `${LIFTED}${entry}`, ...change],
    );
    return Number(reply);
  }

  /**
   * Reads a kind from Redis, and holds what it holds. Where it lacks entries held here (Redis lost
   * them, or they were lifted and the news missed), those not lifted are written back first, and
   * the kind read again.
   */
  private async reloadKind(kind: Kind): Promise<void> {
    let fresh = await this.readKind(kind);
    const lacking = this.lost ? this.lacking(kind, fresh) : [];
    if (lacking.length > 0) {
      // Failing, it throws: what is held here stays, and the next read tries again.
      await this.lost!.restoreEntries(kind, this.keys![kind], lacking);
      fresh = await this.readKind(kind);
    }
    if (kind === 'bans') this.bans.replaceAll(fresh as FreshEntry<undefined>[]);
    else this.overrides.replaceAll(fresh as FreshEntry<RateLimitOverride>[]);
  }

  /** The entries in force held here that `fresh` (as read from Redis) has none of, for their identity. */
  private lacking(kind: Kind, fresh: readonly FreshEntry<unknown>[]): HeldEntry[] {
    const read = new Set(fresh.map(({ scope, identity }) => JSON.stringify([scope, identity])));
    return this.entriesOf(kind)
      .list(this.clock())
      .flatMap(({ scope, identity, value, until }) => {
        if (read.has(JSON.stringify([scope, identity]))) return [];
        const member = JSON.stringify(kind === 'bans' ? [scope, identity] : [scope, identity, value]);
        return [{ scope, identity, member, until }];
      });
  }

  private async readKind(kind: Kind): Promise<FreshEntry<unknown>[]> {
    const key = this.keys![kind];
    const reply = await this.redis!.runner.operation(
      (client) => client.zrangebyscore(key, `(${this.clock()}`, '+inf', 'WITHSCORES'),
      'ZRANGEBYSCORE',
    );
    const fresh: FreshEntry<unknown>[] = [];
    for (let i = 0; i + 1 < reply.length && fresh.length < MAX_IDENTITY_ENTRIES; i += 2) {
      const entry = parseEntry(reply[i]);
      const until = Number(reply[i + 1]);
      if (!entry || !Number.isFinite(until)) continue; // written by hand: not an entry
      const [scope, identity, values] = entry;
      if (kind === 'bans') fresh.push({ scope, identity, value: undefined, until });
      else fresh.push({ scope, identity, value: this.sameOrFrozen(scope, identity, values), until });
    }
    return fresh;
  }

  /** The same object while an override's values stand: the limiter checks a rule with them once per object. */
  private sameOrFrozen(scope: string, identity: string, values: unknown): RateLimitOverride {
    const held = this.overrides.peek(scope, identity)?.value;
    const same = held && JSON.stringify(held) === JSON.stringify(values);
    return same ? held : Object.freeze({ ...(values as RateLimitOverride) });
  }

  private entriesOf(kind: Kind): EndingEntries<unknown> {
    return kind === 'bans' ? this.bans : this.overrides;
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

/** An entry as stored: `[rule or config key, identity]`, with an override's values third. */
function parseEntry(text: string): [string, string, unknown] | undefined {
  try {
    const entry: unknown = JSON.parse(text);
    if (!Array.isArray(entry) || typeof entry[0] !== 'string' || typeof entry[1] !== 'string') return undefined;
    return [entry[0], entry[1], entry[2]];
  } catch {
    return undefined;
  }
}

function kindOf(message: string): Kind | undefined {
  for (const kind of ['bans', 'overrides'] as const) {
    const news = NEWS[kind];
    if (message === news || (message.startsWith(news) && message[news.length] === ' ')) return kind;
  }
  return undefined;
}

/** A change as news carries it: the entry as stored, and when it ends (none: removed). */
function parseChange(text: string): [[string, string, unknown], number | undefined] | undefined {
  try {
    const change: unknown = JSON.parse(text);
    if (!Array.isArray(change)) return undefined;
    const entry = parseEntry(JSON.stringify(change[0]));
    const until: unknown = change[1];
    if (!entry || (until !== undefined && (typeof until !== 'number' || !Number.isFinite(until)))) return undefined;
    return [entry, until as number | undefined];
  } catch {
    return undefined;
  }
}

function tooMany(kind: Kind): Error {
  return new RateLimitConfigurationError(`At most ${MAX_IDENTITY_ENTRIES} ${kind} are held at once; remove some first`);
}

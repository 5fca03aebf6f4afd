import { EVERY_RULE, type IdentityControls, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';

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
/** The message announcing a change of each kind on the live limits' channel; no config key starts with `~`. */
const NEWS: Record<Kind, string> = { bans: '~bans', overrides: '~overrides' };

/**
 * Bans and per-identity overrides, held in memory on every instance (the limiter reads them per
 * request, never the store) and, with Redis, kept in two sorted sets beside the live limits
 * (`<prefix>:config:bans`, `<prefix>:config:overrides`; each member an entry, its score when it
 * ends). Every entry ends: one past its time is neither held nor read, writes drop those that
 * ended, and each set expires with its last entry, so no key outlives what it holds. A write is
 * announced on the live limits' channel, and every instance reads the set again: in milliseconds,
 * or at its next periodic read (`liveConfig.refreshMs`) when the news was missed.
 */
export class IdentityEntries implements IdentityControls {
  private bans = new Map<string, Map<string, number>>();
  private banCount = 0;
  private overrides = new Map<string, Map<string, { values: RateLimitOverride; until: number }>>();
  private overrideCount = 0;
  private readonly keys: Record<Kind, string> | undefined;
  private readonly channel: string;

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

  get anyBans(): boolean {
    return this.banCount > 0;
  }

  get anyOverrides(): boolean {
    return this.overrideCount > 0;
  }

  banUntil(rule: string, identity: string, now: number): number | undefined {
    const until = Math.max(
      this.bans.get(rule)?.get(identity) ?? 0,
      rule === EVERY_RULE ? 0 : (this.bans.get(EVERY_RULE)?.get(identity) ?? 0),
    );
    return until > now ? until : undefined;
  }

  overrideOf(configKey: string, identity: string, now: number): RateLimitOverride | undefined {
    const entry = this.overrides.get(configKey)?.get(identity);
    return entry && entry.until > now ? entry.values : undefined;
  }

  /** Whether news of this kind names these entries: the live limits' channel carries both. */
  isNews(message: string): boolean {
    return message === NEWS.bans || message === NEWS.overrides;
  }

  /** Reads both kinds from Redis again (nothing to read without it). */
  async reload(): Promise<void> {
    if (!this.redis) return;
    await Promise.all([this.reloadKind('bans'), this.reloadKind('overrides')]);
  }

  /** The bans in force, from their source. */
  async listBans(): Promise<RateLimitBan[]> {
    await this.reload();
    const now = this.clock();
    return [...this.bans].flatMap(([rule, byIdentity]) =>
      [...byIdentity].flatMap(([identity, until]) =>
        until > now ? [{ rule, identity, until: new Date(until).toISOString() }] : [],
      ),
    );
  }

  async listOverrides(): Promise<RateLimitIdentityOverride[]> {
    await this.reload();
    const now = this.clock();
    return [...this.overrides].flatMap(([configKey, byIdentity]) =>
      [...byIdentity].flatMap(([identity, { values, until }]) =>
        until > now ? [{ configKey, identity, values, until: new Date(until).toISOString() }] : [],
      ),
    );
  }

  async ban(rule: string, identity: string, until: number): Promise<void> {
    await this.write('bans', [rule, identity], until, () => this.hold('bans', [rule, identity], until));
  }

  async unban(rule: string, identity: string): Promise<boolean> {
    const held = (this.bans.get(rule)?.get(identity) ?? 0) > this.clock();
    return this.remove('bans', [rule, identity], held);
  }

  async setOverride(configKey: string, identity: string, values: RateLimitOverride, until: number): Promise<void> {
    const member: unknown[] = [configKey, identity, values];
    await this.write('overrides', member, until, () => this.hold('overrides', member, until));
  }

  async deleteOverride(configKey: string, identity: string): Promise<boolean> {
    const held = (this.overrides.get(configKey)?.get(identity)?.until ?? 0) > this.clock();
    return this.remove('overrides', [configKey, identity], held);
  }

  /**
   * Adds an entry (replacing the identity's entry of that rule or key), drops those that ended,
   * keeps the set until its last entry ends, and announces it. Refused past `MAX_IDENTITY_ENTRIES`.
   */
  private async write(kind: Kind, member: unknown[], until: number, holdHere: () => void): Promise<void> {
    const now = this.clock();
    if (!this.redis) {
      if (this.countOf(kind) >= MAX_IDENTITY_ENTRIES && !this.holds(kind, member)) throw tooMany(kind);
      holdHere();
      return;
    }
    const key = this.keys![kind];
    const client = this.redis.client;
    const members = await this.redis.operation(client.zrangebyscore(key, `(${now}`, '+inf'), 'ZRANGEBYSCORE');
    const same = members.filter((text) => sameEntry(text, member));
    if (members.length - same.length >= MAX_IDENTITY_ENTRIES) throw tooMany(kind);
    const ttl = Math.max(1, Math.ceil(until - now));
    const multi = client.multi().zremrangebyscore(key, '-inf', now);
    if (same.length > 0) multi.zrem(key, ...same);
    // NX sets the new set's expiry, GT lengthens it: never shortened under an entry that ends later.
    multi.zadd(key, until, JSON.stringify(member)).pexpire(key, ttl, 'NX').pexpire(key, ttl, 'GT');
    await this.redis.operation(multi.exec().then(failedCommand), 'MULTI');
    holdHere();
    await this.redis.publish(this.channel, NEWS[kind]);
  }

  private async remove(kind: Kind, member: unknown[], heldHere: boolean): Promise<boolean> {
    if (!this.redis) {
      this.drop(kind, member);
      return heldHere;
    }
    const key = this.keys![kind];
    const members = await this.redis.operation(
      this.redis.client.zrangebyscore(key, `(${this.clock()}`, '+inf'),
      'ZRANGEBYSCORE',
    );
    const same = members.filter((text) => sameEntry(text, member));
    if (same.length > 0) await this.redis.operation(this.redis.client.zrem(key, ...same), 'ZREM');
    this.drop(kind, member);
    await this.redis.publish(this.channel, NEWS[kind]);
    return same.length > 0;
  }

  private async reloadKind(kind: Kind): Promise<void> {
    const key = this.keys![kind];
    const reply = await this.redis!.operation(
      this.redis!.client.zrangebyscore(key, `(${this.clock()}`, '+inf', 'WITHSCORES'),
      'ZRANGEBYSCORE',
    );
    const fresh = new Map<string, Map<string, unknown>>();
    let count = 0;
    const previous = kind === 'bans' ? this.bans : this.overrides;
    for (let i = 0; i + 1 < reply.length && count < MAX_IDENTITY_ENTRIES; i += 2) {
      const entry = parseEntry(reply[i]);
      const until = Number(reply[i + 1]);
      if (!entry || !Number.isFinite(until)) continue; // written by hand: not an entry
      const [scope, identity, values] = entry;
      let byIdentity = fresh.get(scope);
      if (!byIdentity) fresh.set(scope, (byIdentity = new Map()));
      if (kind === 'bans') byIdentity.set(identity, until);
      else {
        // The same object while the values stand: the limiter checks a rule with them once per object.
        const held = (previous as IdentityEntries['overrides']).get(scope)?.get(identity);
        const same = held && JSON.stringify(held.values) === JSON.stringify(values);
        byIdentity.set(identity, {
          values: same ? held.values : Object.freeze({ ...(values as RateLimitOverride) }),
          until,
        });
      }
      count += 1;
    }
    if (kind === 'bans') {
      this.bans = fresh as unknown as IdentityEntries['bans'];
      this.banCount = count;
    } else {
      this.overrides = fresh as unknown as IdentityEntries['overrides'];
      this.overrideCount = count;
    }
  }

  private hold(kind: Kind, [scope, identity, values]: unknown[], until: number): void {
    const map = (kind === 'bans' ? this.bans : this.overrides) as Map<string, Map<string, unknown>>;
    let byIdentity = map.get(scope as string);
    if (!byIdentity) map.set(scope as string, (byIdentity = new Map()));
    if (!byIdentity.has(identity as string)) this.add(kind, 1);
    byIdentity.set(
      identity as string,
      kind === 'bans' ? until : { values: Object.freeze({ ...(values as RateLimitOverride) }), until },
    );
  }

  private drop(kind: Kind, [scope, identity]: unknown[]): void {
    const map = (kind === 'bans' ? this.bans : this.overrides) as Map<string, Map<string, unknown>>;
    if (map.get(scope as string)?.delete(identity as string)) this.add(kind, -1);
  }

  private holds(kind: Kind, [scope, identity]: unknown[]): boolean {
    const map = (kind === 'bans' ? this.bans : this.overrides) as Map<string, Map<string, unknown>>;
    return map.get(scope as string)?.has(identity as string) ?? false;
  }

  private add(kind: Kind, delta: number): void {
    if (kind === 'bans') this.banCount += delta;
    else this.overrideCount += delta;
  }

  private countOf(kind: Kind): number {
    return kind === 'bans' ? this.banCount : this.overrideCount;
  }
}

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

/** Whether a stored member is the entry of the same rule (or key) and identity. */
function sameEntry(text: string, [scope, identity]: unknown[]): boolean {
  const entry = parseEntry(text);
  return entry !== undefined && entry[0] === scope && entry[1] === identity;
}

function failedCommand(results: [Error | null, unknown][] | null): void {
  const failed = results?.find(([error]) => error);
  if (failed) throw failed[0];
}

function tooMany(kind: Kind): Error {
  return new RateLimitConfigurationError(`At most ${MAX_IDENTITY_ENTRIES} ${kind} are held at once; remove some first`);
}

import { EVERY_RULE, type IdentityControls, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { MAX_DURATION_MS } from '../rules/duration.js';
import { BannedNetworks } from './banned-networks.js';
import { EndingEntries, type FreshEntry } from './ending-entries.js';
import { changeInNews, kindOfNews, newsOfChange } from './identity-entry-news.js';
import { type IdentityEntryKind as Kind, IdentityEntrySets } from './identity-entry-sets.js';
import type { HeldEntry, LostControls } from './lost-controls.js';

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

/**
 * Bans and per-identity overrides, held in memory on every instance (the limiter reads them per
 * request, never the store) and, with Redis, kept in two sorted sets beside the live limits
 * (`<prefix>:config:bans`, `<prefix>:config:overrides`: `IdentityEntrySets`; each member an entry,
 * its score when it ends). Every entry ends: one past its time is neither held nor read (held ones
 * are dropped as soon as a lookup or a write comes after the first of them ends, so they take no
 * room), writes drop those that ended, and each set expires with its last entry, so no key outlives
 * what it holds. A write is announced on the live limits' channel with the entry it changed
 * (`identity-entry-news.ts`), which every instance applies to what it holds: in milliseconds,
 * without reading the set (25 to 60 ms at 10,000 entries); what news missed or mixed up, the next
 * periodic read of the whole set (`liveConfig.refreshMs`) mends.
 *
 * A ban of a network (`203.0.113.0/24`, `2001:db8::/48`) holds for every address in it: such bans
 * are indexed by prefix length as well (`BannedNetworks`), so a request is matched against them
 * with one map lookup per prefix length held, however many there are.
 */
export class IdentityEntries implements IdentityControls {
  private readonly networks = new BannedNetworks();
  private readonly bans = new EndingEntries<undefined>(this.networks);
  private readonly overrides = new EndingEntries<RateLimitOverride>();
  /** Where the entries are shared; none: this process holds them alone. */
  private readonly sets: IdentityEntrySets | undefined;
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
    if (redis) this.sets = new IdentityEntrySets(redis, keys.hash, MAX_IDENTITY_ENTRIES);
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
    return kindOfNews(message) !== undefined;
  }

  /**
   * Applies news of a change: the entry it carries, as the write left it in Redis; news without
   * one (from an earlier version), or that cannot be read, has the kind read again.
   */
  async hear(message: string): Promise<void> {
    const kind = kindOfNews(message);
    if (!kind) return;
    const change = changeInNews(kind, message);
    if (!change) return this.sets ? this.reloadKind(kind) : undefined;
    const [[scope, identity, values], until] = change;
    if (until === undefined || until <= this.clock()) this.entriesOf(kind).delete(scope, identity);
    else if (kind === 'bans') this.bans.set(scope, identity, undefined, until);
    else this.overrides.set(scope, identity, this.sameOrFrozen(scope, identity, values), until);
  }

  /** Reads both kinds from Redis again (nothing to read without it). */
  async reload(): Promise<void> {
    if (!this.sets) return;
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
    const replaced = await this.sets!.replace(kind, member, now, [until, JSON.stringify(member), ttl]);
    if (replaced < 0) throw tooMany(kind);
    holdHere();
    await this.redis.news.publish(this.channel, newsOfChange(kind, member, until));
  }

  /** @param heldUntil when the entry held here ends; none: none is held. */
  private async remove(kind: Kind, member: unknown[], heldUntil: number | undefined): Promise<boolean> {
    const [scope, identity] = member as [string, string];
    if (!this.redis) {
      this.entriesOf(kind).delete(scope, identity);
      return heldUntil !== undefined;
    }
    const now = this.clock();
    const removed = await this.sets!.replace(kind, member, now, ['lift', heldUntil ?? 0, now + MAX_DURATION_MS]);
    this.entriesOf(kind).delete(scope, identity);
    await this.redis.news.publish(this.channel, newsOfChange(kind, [scope, identity]));
    return removed > 0;
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
      await this.lost!.restoreEntries(kind, this.sets!.keys[kind], lacking);
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
    const fresh = await this.sets!.read(kind, this.clock());
    if (kind === 'bans') return fresh;
    return fresh.map(({ scope, identity, value, until }) => ({
      scope,
      identity,
      value: this.sameOrFrozen(scope, identity, value),
      until,
    }));
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

function tooMany(kind: Kind): Error {
  return new RateLimitConfigurationError(`At most ${MAX_IDENTITY_ENTRIES} ${kind} are held at once; remove some first`);
}

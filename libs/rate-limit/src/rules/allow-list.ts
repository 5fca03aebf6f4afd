import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { describeValue as show } from './describe-value.js';

/**
 * Requests let through without being counted: by the client's address, by the identity a rule counts
 * them under, or by their `User-Agent`. Module-wide (the `allow` option) or per rule; a config centre
 * can replace either while the app runs (the `allow` field of a config key's values).
 */
export interface RateLimitAllowList {
  /** Client addresses and networks, IPv4 or IPv6: `'203.0.113.7'`, `'10.0.0.0/8'`, `'2001:db8::/32'`. */
  addresses?: readonly string[];
  /** Identities as a rule's `by` gives them (a user id, an API key, a tenant). */
  identities?: readonly string[];
  /**
   * `User-Agent`s (throttler's `ignoreUserAgents`): a `RegExp`, or a string found anywhere in the
   * header, ignoring case. A config centre's values are strings.
   */
  userAgents?: readonly (string | RegExp)[];
}

const FIELDS = ['addresses', 'identities', 'userAgents'] as const;
/** Entries held at most per field: an allow list is a handful of partners, not a database. */
const MAX_ENTRIES = 10_000;

/**
 * An allow list checked and made ready for requests: addresses in a `BlockList` (prefix matching for
 * both families, IPv4-mapped IPv6 as IPv4), identities in a set, user agents as expressions.
 */
export class AllowList {
  private readonly addresses: BlockList | undefined;
  private readonly identities: ReadonlySet<string> | undefined;
  private readonly userAgents: readonly RegExp[] | undefined;

  private constructor(
    /** As given: to be validated again with new values, and shown. */
    readonly source: RateLimitAllowList,
    addresses: BlockList | undefined,
    identities: ReadonlySet<string> | undefined,
    userAgents: readonly RegExp[] | undefined,
  ) {
    this.addresses = addresses;
    this.identities = identities;
    this.userAgents = userAgents;
  }

  /** Whether it holds addresses or user agents, which are known before any rule's identity. */
  get readsRequest(): boolean {
    return this.addresses !== undefined || this.userAgents !== undefined;
  }

  get readsIdentities(): boolean {
    return this.identities !== undefined;
  }

  allowsAddress(address: string | undefined): boolean {
    if (!this.addresses || !address) return false;
    const mapped = address.startsWith('::ffff:') ? address.slice(7) : address;
    if (isIPv4(mapped)) return this.addresses.check(mapped, 'ipv4');
    return isIPv6(address) && this.addresses.check(address, 'ipv6');
  }

  allowsIdentity(identity: string): boolean {
    return this.identities?.has(identity) ?? false;
  }

  allowsUserAgent(userAgent: string | undefined): boolean {
    if (!this.userAgents || !userAgent) return false;
    for (const pattern of this.userAgents) if (pattern.test(userAgent)) return true;
    return false;
  }

  /**
   * The list made ready, or the problems found, each naming the field (`allow.addresses[2]`). An
   * empty list (or fields all empty) is no list: `undefined`.
   */
  static parse(raw: unknown, field = 'allow'): { list?: AllowList; problems: string[] } {
    const problems: string[] = [];
    if (raw === undefined || raw === null) return { problems };
    if (typeof raw !== 'object' || Array.isArray(raw)) {
      return { problems: [`'${field}' must be an object of ${FIELDS.join(', ')}, got ${show(raw)}`] };
    }
    const given = raw as Record<string, unknown>;
    for (const name of Object.keys(given)) {
      if (!(FIELDS as readonly string[]).includes(name)) {
        problems.push(`'${field}.${name}' is not a field of an allow list (fields: ${FIELDS.join(', ')})`);
      }
    }
    const entries = (name: (typeof FIELDS)[number]): unknown[] | undefined => {
      const value = Object.hasOwn(given, name) ? given[name] : undefined;
      if (value === undefined || value === null) return undefined;
      if (!Array.isArray(value)) {
        problems.push(`'${field}.${name}' must be an array, got ${show(value)}`);
        return undefined;
      }
      if (value.length > MAX_ENTRIES) {
        problems.push(`'${field}.${name}' holds ${value.length} entries, more than ${MAX_ENTRIES}`);
        return undefined;
      }
      return value.length > 0 ? value : undefined;
    };

    let addresses: BlockList | undefined;
    for (const [i, entry] of (entries('addresses') ?? []).entries()) {
      const network = parseNetwork(entry);
      if (!network) {
        problems.push(
          `'${field}.addresses[${i}]' must be an IPv4 or IPv6 address or network ('10.0.0.0/8', '2001:db8::/32'), got ${show(entry)}`,
        );
        continue;
      }
      addresses ??= new BlockList();
      addresses.addSubnet(network.address, network.prefix, network.family);
    }
    let identities: Set<string> | undefined;
    for (const [i, entry] of (entries('identities') ?? []).entries()) {
      if (typeof entry !== 'string' || entry === '') {
        problems.push(`'${field}.identities[${i}]' must be a non-empty string, got ${show(entry)}`);
        continue;
      }
      (identities ??= new Set()).add(entry);
    }
    let userAgents: RegExp[] | undefined;
    for (const [i, entry] of (entries('userAgents') ?? []).entries()) {
      if (entry instanceof RegExp) {
        // Without the state a global or sticky expression keeps between `test` calls.
        (userAgents ??= []).push(new RegExp(entry.source, entry.flags.replace(/[gy]/g, '')));
      } else if (typeof entry === 'string' && entry !== '') {
        (userAgents ??= []).push(new RegExp(entry.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i'));
      } else {
        problems.push(`'${field}.userAgents[${i}]' must be a RegExp or a non-empty string, got ${show(entry)}`);
      }
    }
    if (problems.length > 0 || (!addresses && !identities && !userAgents)) return { problems };
    return { list: new AllowList(raw as RateLimitAllowList, addresses, identities, userAgents), problems };
  }
}

function parseNetwork(entry: unknown): { address: string; prefix: number; family: 'ipv4' | 'ipv6' } | undefined {
  if (typeof entry !== 'string') return undefined;
  const [address, bits, ...rest] = entry.trim().split('/');
  if (rest.length > 0) return undefined;
  const family = isIPv4(address) ? 'ipv4' : isIPv6(address) ? 'ipv6' : undefined;
  if (!family) return undefined;
  const max = family === 'ipv4' ? 32 : 128;
  if (bits === undefined) return { address, prefix: max, family };
  if (!/^\d{1,3}$/.test(bits) || Number(bits) > max) return undefined;
  return { address, prefix: Number(bits), family };
}

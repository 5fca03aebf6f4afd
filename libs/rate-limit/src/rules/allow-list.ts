import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { describeValue as show } from './describe-value.js';

/**
 * Requests let through without being counted: by the client's address, by the identity a rule counts
 * them under, or by their `User-Agent` from given networks. Module-wide (the `allow` option) or per
 * rule; a config centre can replace either while the app runs (the `allow` field of a config key's
 * values).
 */
export interface RateLimitAllowList {
  /** Client addresses and networks, IPv4 or IPv6: `'203.0.113.7'`, `'10.0.0.0/8'`, `'2001:db8::/32'`. */
  addresses?: readonly string[];
  /** Identities as a rule's `by` gives them (a user id, an API key, a tenant). */
  identities?: readonly string[];
  /**
   * `User-Agent`s, each with the networks it must come from (throttler's `ignoreUserAgents`, made
   * safe): `{ agent: 'kube-probe', from: ['10.0.0.0/8'] }`. A client names its own user agent, so
   * on its own it would let anyone through who sends it: the network is what it cannot choose.
   */
  userAgents?: readonly {
    /** A `RegExp`, or a string found anywhere in the header, ignoring case. A config centre's values are strings. */
    agent: string | RegExp;
    /** Client addresses and networks it must come from, as in `addresses`; at least one, none of every address. */
    from: readonly string[];
  }[];
}

const FIELDS = ['addresses', 'identities', 'userAgents'] as const;
const USER_AGENT_FIELDS = ['agent', 'from'] as const;
/** Entries held at most per field: an allow list is a handful of partners, not a database. */
const MAX_ENTRIES = 10_000;

/** A user agent made ready: its expression, and the networks it must come from. */
interface UserAgentFromNetworks {
  pattern: RegExp;
  from: BlockList;
}

/**
 * An allow list checked and made ready for requests: addresses in a `BlockList` (prefix matching for
 * both families, IPv4-mapped IPv6 as IPv4), identities in a set, user agents as expressions, each
 * with its networks.
 */
export class AllowList {
  private readonly addresses: BlockList | undefined;
  private readonly identities: ReadonlySet<string> | undefined;
  private readonly userAgents: readonly UserAgentFromNetworks[] | undefined;

  private constructor(
    /** As given: to be validated again with new values, and shown. */
    readonly source: RateLimitAllowList,
    addresses: BlockList | undefined,
    identities: ReadonlySet<string> | undefined,
    userAgents: readonly UserAgentFromNetworks[] | undefined,
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

  /** Whether the client is let through by its address, or by its user agent from a network given with it. */
  allowsClient(address: string | undefined, userAgent: string | undefined): boolean {
    if (!address) return false;
    if (this.addresses && inNetworks(this.addresses, address)) return true;
    if (!this.userAgents || !userAgent) return false;
    for (const { pattern, from } of this.userAgents) {
      if (pattern.test(userAgent) && inNetworks(from, address)) return true;
    }
    return false;
  }

  allowsIdentity(identity: string): boolean {
    return this.identities?.has(identity) ?? false;
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

    const addresses = parseNetworks(entries('addresses') ?? [], `${field}.addresses`, problems);
    let identities: Set<string> | undefined;
    for (const [i, entry] of (entries('identities') ?? []).entries()) {
      if (typeof entry !== 'string' || entry === '') {
        problems.push(`'${field}.identities[${i}]' must be a non-empty string, got ${show(entry)}`);
        continue;
      }
      (identities ??= new Set()).add(entry);
    }
    let userAgents: UserAgentFromNetworks[] | undefined;
    for (const [i, entry] of (entries('userAgents') ?? []).entries()) {
      const made = parseUserAgent(entry, `${field}.userAgents[${i}]`, problems);
      if (made) (userAgents ??= []).push(made);
    }
    if (problems.length > 0 || (!addresses && !identities && !userAgents)) return { problems };
    return { list: new AllowList(raw as RateLimitAllowList, addresses, identities, userAgents), problems };
  }
}

/** Whether an address is in the networks: IPv4-mapped IPv6 as IPv4. */
function inNetworks(networks: BlockList, address: string): boolean {
  const mapped = address.startsWith('::ffff:') ? address.slice(7) : address;
  if (isIPv4(mapped)) return networks.check(mapped, 'ipv4');
  return isIPv6(address) && networks.check(address, 'ipv6');
}

/** Addresses and networks in a `BlockList`, each bad one a problem naming it (`allow.addresses[2]`). */
function parseNetworks(entries: readonly unknown[], field: string, problems: string[]): BlockList | undefined {
  let networks: BlockList | undefined;
  for (const [i, entry] of entries.entries()) {
    const network = parseNetwork(entry);
    if (!network) {
      problems.push(
        `'${field}[${i}]' must be an IPv4 or IPv6 address or network ('10.0.0.0/8', '2001:db8::/32'), got ${show(entry)}`,
      );
      continue;
    }
    networks ??= new BlockList();
    networks.addSubnet(network.address, network.prefix, network.family);
  }
  return networks;
}

/**
 * A user agent with its networks, or the problems found. A bare one (a string or a `RegExp`) is
 * refused: any client can send it, and it would lift every rule for them.
 */
function parseUserAgent(entry: unknown, field: string, problems: string[]): UserAgentFromNetworks | undefined {
  if (typeof entry === 'string' || entry instanceof RegExp) {
    const agent = typeof entry === 'string' ? `'${entry.slice(0, 60).replace(/['\\]/g, '\\$&')}'` : String(entry);
    problems.push(
      `'${field}' is a user agent alone, which any client can send; give the networks it comes from: { agent: ${agent}, from: ['10.0.0.0/8'] }`,
    );
    return undefined;
  }
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) {
    problems.push(
      `'${field}' must be { agent, from }, a user agent and the networks it comes from, got ${show(entry)}`,
    );
    return undefined;
  }
  const given = entry as Record<string, unknown>;
  const before = problems.length;
  for (const name of Object.keys(given)) {
    if (!(USER_AGENT_FIELDS as readonly string[]).includes(name)) {
      problems.push(`'${field}.${name}' is not a field of an allowed user agent (fields: agent, from)`);
    }
  }
  const { agent, from } = given;
  let pattern: RegExp | undefined;
  if (agent instanceof RegExp) {
    // Without the state a global or sticky expression keeps between `test` calls.
    pattern = new RegExp(agent.source, agent.flags.replace(/[gy]/g, ''));
  } else if (typeof agent === 'string' && agent !== '') {
    pattern = new RegExp(agent.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i');
  } else {
    problems.push(`'${field}.agent' must be a RegExp or a non-empty string, got ${show(agent)}`);
  }
  let networks: BlockList | undefined;
  if (!Array.isArray(from) || from.length === 0) {
    problems.push(
      `'${field}.from' must be the networks the user agent comes from, at least one ('10.0.0.0/8'), got ${show(from)}`,
    );
  } else if (from.length > MAX_ENTRIES) {
    problems.push(`'${field}.from' holds ${from.length} entries, more than ${MAX_ENTRIES}`);
  } else {
    networks = parseNetworks(from, `${field}.from`, problems);
    for (const [i, network] of from.entries()) {
      // A network of every address is the bare user agent again.
      if (parseNetwork(network)?.prefix === 0) {
        problems.push(
          `'${field}.from[${i}]' is every address, which lets any client through that sends the user agent; give the networks it comes from`,
        );
      }
    }
  }
  if (problems.length > before || !pattern || !networks) return undefined;
  return { pattern, from: networks };
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

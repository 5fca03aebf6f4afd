import { isIPv4, isIPv6 } from 'node:net';
import { createHash } from 'node:crypto';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';

/** Identities used in keys as they are: short, and nothing that could pick a Cluster slot (braces). */
const PLAIN_IDENTITY = /^[A-Za-z0-9._:-]{1,64}$/;

const ALGORITHM_TAG: Record<RateLimitAlgorithmName, string> = {
  'fixed-window': 'fw',
  'sliding-window': 'sw',
  'sliding-log': 'sl',
  'token-bucket': 'tb',
  gcra: 'gc',
};

/**
 * Stands for requests whose `by` resolver gave no identity. `~` is in no plain identity and no
 * digest, so no real identity shares its counter.
 */
export const ANONYMOUS_IDENTITY = '~anonymous';

/**
 * The identity as it appears in keys: itself when short and plain, `#` and its SHA-256 otherwise,
 * and `~anonymous` for `null` (no identity).
 */
export function identityPart(identity: string | null): string {
  if (identity === null) return ANONYMOUS_IDENTITY;
  return PLAIN_IDENTITY.test(identity) ? identity : `#${createHash('sha256').update(identity).digest('base64url')}`;
}

/** Rule names used in keys as they are: no longer than a digest id, so no rule's keys are longer for it. */
const PLAIN_RULE_ID = /^[A-Za-z0-9._$-]{1,9}$/;

/** Base64url characters of the SHA-256 of a rule name in its digest id: 48 bits. */
const RULE_DIGEST_CHARS = 8;

/**
 * A rule as it appears in keys: its name when short and plain (`login`, `orders`), otherwise `~`
 * and 8 base64url characters of the SHA-256 of its name (`PingController.ping` becomes
 * `~fBUkyazd`). The same on every instance and deploy, with nothing to coordinate; never `:`, `{`
 * or `}`. `~` is in no rule name, so a name and a digest never meet. Two names of one digest would
 * share counters: the rule registry refuses them at bootstrap.
 */
export function ruleKeyId(ruleName: string): string {
  if (PLAIN_RULE_ID.test(ruleName)) return ruleName;
  return `~${createHash('sha256').update(ruleName).digest('base64url').slice(0, RULE_DIGEST_CHARS)}`;
}

/**
 * The state key of a rule for an identity: `prefix:{identity}:rule:algorithm`, the rule as its
 * `ruleKeyId`. The identity is the hash tag, so all keys of one identity share a Cluster slot; the
 * digest form starts with `#`, which no plain identity contains, so two identities never share a
 * key. The algorithm is part of the key so that changing a rule's algorithm never reads state of
 * another shape.
 *
 * @example rateLimitKey('rl', 'PingController.ping', '127.0.0.1', 'fixed-window') // 'rl:{127.0.0.1}:~fBUkyazd:fw'
 */
export function rateLimitKey(
  prefix: string,
  ruleName: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): string {
  return ruleStateKey(prefix, ruleKeyId(ruleName), identity, algorithm);
}

/** `rateLimitKey` for a rule whose `ruleKeyId` is known (a compiled rule's `keyId`): no digest per request. */
export function ruleStateKey(
  prefix: string,
  keyId: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): string {
  return `${prefix}:{${identityPart(identity)}}:${keyId}:${ALGORITHM_TAG[algorithm]}`;
}

/**
 * The rule id of a key of the layout (a state key or one beside it): its segment before the last,
 * since neither an id nor an algorithm tag holds a `:`. For showing keys to people, with the names
 * of the rules known (`ruleKeyId` of each).
 */
export function keyIdOf(key: string): string {
  const end = key.lastIndexOf(':');
  return key.slice(key.lastIndexOf(':', end - 1) + 1, end);
}

/** The keys a store may keep beside a state key: in the same hash slot, shared by the rule's algorithms. */
export interface RateLimitKeysBeside {
  /** The time a `blockFor` penalty ends. */
  blockKey: string;
  /** Redis, fixed window: the window's count once high, kept as long as the window (a failover defence). */
  markerKey: string;
  /** `countOn` admissions whose responses have not ended. */
  pendingKey: string;
}

/** The keys beside a state key: its last segment (the algorithm) replaced. */
export function keysBeside(key: string): RateLimitKeysBeside {
  const base = key.slice(0, key.lastIndexOf(':'));
  return { blockKey: `${base}:block`, markerKey: `${base}:mark`, pendingKey: `${base}:pend` };
}

/** Every key of a rule (by its name) for an identity: the documented layout, for tools and tests. */
export function rateLimitKeys(
  prefix: string,
  ruleName: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): { key: string } & RateLimitKeysBeside {
  const key = rateLimitKey(prefix, ruleName, identity, algorithm);
  return { key, ...keysBeside(key) };
}

/**
 * Where the live limits are (`RedisConfigCentre`): the hash of values by config key (the one key
 * kept without a TTL, by design), the channel a write announces its key on, the catalogue of
 * the rules that read them, and the log of changes made through the management service.
 */
export function liveConfigKeys(keyPrefix: string): { hash: string; channel: string; rules: string; changes: string } {
  return {
    hash: `${keyPrefix}:config`,
    channel: `${keyPrefix}:config:changed`,
    rules: `${keyPrefix}:config:rules`,
    changes: `${keyPrefix}:config:changes`,
  };
}

/**
 * The identity of a client address for `by: 'ip'`. IPv4 (and IPv4-mapped IPv6) as it is; IPv6
 * reduced to its first `ipv6PrefixBits` bits (`2001:db8:1:2::/64`), since one subscriber is usually
 * given a whole /64 and could otherwise rotate addresses to escape the limit.
 */
export function clientAddressIdentity(address: string, ipv6PrefixBits: number): string {
  // Every IPv6 spelling has a ':': an IPv4 client skips the long regex of `isIPv6`.
  if (!address.includes(':')) return address;
  if (address.startsWith('::ffff:') && isIPv4(address.slice(7))) return address.slice(7);
  if (!isIPv6(address)) return address;
  const groups = expandIPv6(address);
  // ::ffff:a.b.c.d in any spelling (upper case, zeros written out, hex groups) is an IPv4 client.
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) {
    return [groups[6] >> 8, groups[6] & 0xff, groups[7] >> 8, groups[7] & 0xff].join('.');
  }
  if (ipv6PrefixBits >= 128) return address;
  const masked = groups.map((group, i) => {
    const bitsBefore = i * 16;
    if (bitsBefore + 16 <= ipv6PrefixBits) return group;
    if (bitsBefore >= ipv6PrefixBits) return 0;
    const keep = ipv6PrefixBits - bitsBefore;
    return group & (0xffff << (16 - keep)) & 0xffff;
  });
  return `${compressIPv6(masked)}/${ipv6PrefixBits}`;
}

/** An IPv6 address's eight groups (an IPv4 tail as two, a zone index dropped), checked with `isIPv6` first. */
export function expandIPv6(address: string): number[] {
  let text = address.split('%')[0]; // zone index
  const lastColon = text.lastIndexOf(':');
  const tail = text.slice(lastColon + 1);
  if (isIPv4(tail)) {
    const [a, b, c, d] = tail.split('.').map(Number);
    text = `${text.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, rest] = text.split('::');
  const left = head ? head.split(':') : [];
  const right = rest === undefined ? [] : rest ? rest.split(':') : [];
  const zeros = rest === undefined ? 0 : 8 - left.length - right.length;
  return [...left, ...Array.from({ length: zeros }, () => '0'), ...right].map((group) => parseInt(group, 16));
}

function compressIPv6(groups: number[]): string {
  // Replace the longest run of zero groups (two or more) with '::'.
  let bestStart = -1;
  let bestLength = 1;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i += 1;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j += 1;
    if (j - i > bestLength) {
      bestStart = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = groups.map((group) => group.toString(16));
  if (bestStart < 0) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLength).join(':')}`;
}

import { isIPv4, isIPv6 } from 'node:net';

/**
 * The identity of a client address for `by: 'ip'`. IPv4 (and IPv4-mapped IPv6) as it is; IPv6
 * reduced to its first `ipv6PrefixBits` bits (`2001:db8:1:2::/64`), since one subscriber is usually
 * given a whole /64 and could otherwise rotate addresses to escape the limit.
 */
export function clientAddressIdentity(address: string, ipv6PrefixBits: number): string {
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

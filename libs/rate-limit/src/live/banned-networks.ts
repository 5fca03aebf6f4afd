import { isIPv4, isIPv6 } from 'node:net';
import { expandIPv6 } from '../store/key-layout.js';
import type { EntryIndex } from './ending-entries.js';

/** An address, or a network (`bits` < the family's width), as a number: IPv4 in 32 bits, IPv6 in 128. */
export type AddressBits = { family: 4; value: number; bits: number } | { family: 6; value: bigint; bits: number };

/**
 * Reads `203.0.113.7`, `203.0.113.0/24`, `2001:db8::1` or `2001:db8::/32` (an IPv6 client counted
 * per prefix is such a network: `2001:db8:1:2::/64`). Anything else, including an address written
 * with leading zeros, in hex or as one number, is none: undefined.
 */
export function addressBits(text: string): AddressBits | undefined {
  const slash = text.indexOf('/');
  const address = slash < 0 ? text : text.slice(0, slash);
  const prefix = slash < 0 ? undefined : text.slice(slash + 1);
  if (prefix !== undefined && !/^\d{1,3}$/.test(prefix)) return undefined;
  if (isIPv4(address)) {
    const bits = prefix === undefined ? 32 : Number(prefix);
    if (bits > 32) return undefined;
    const [a, b, c, d] = address.split('.').map(Number);
    return { family: 4, value: masked4(((a << 24) | (b << 16) | (c << 8) | d) >>> 0, bits), bits };
  }
  if (isIPv6(address) && !address.includes('%')) {
    const bits = prefix === undefined ? 128 : Number(prefix);
    if (bits > 128) return undefined;
    const value = expandIPv6(address).reduce((sum, group) => (sum << 16n) | BigInt(group), 0n);
    return { family: 6, value: masked6(value, bits), bits };
  }
  return undefined;
}

function masked4(value: number, bits: number): number {
  return bits === 0 ? 0 : (value & (-1 << (32 - bits))) >>> 0;
}

const ALL_128 = (1n << 128n) - 1n;

function masked6(value: bigint, bits: number): bigint {
  return value & ((ALL_128 << BigInt(128 - bits)) & ALL_128);
}

/** A scope's networks: per prefix length, the network (masked) and the entry's identity. */
interface ScopeNetworks {
  v4: Map<number, Map<number, string>>;
  v6: Map<number, Map<bigint, string>>;
  size: number;
}

/**
 * The bans on networks (`203.0.113.0/24`, `2001:db8::/48`), by scope, kept beside the bans as they
 * come and go, so a request's address is matched against all of a scope's networks with one map
 * lookup per prefix length held (at most 33 for IPv4, 129 for IPv6), never a scan of the networks.
 */
export class BannedNetworks implements EntryIndex {
  private readonly byScope = new Map<string, ScopeNetworks>();

  add(scope: string, identity: string): void {
    const network = networkOf(identity);
    if (!network) return;
    let held = this.byScope.get(scope);
    if (!held) this.byScope.set(scope, (held = { v4: new Map(), v6: new Map(), size: 0 }));
    const byBits = (network.family === 4 ? held.v4 : held.v6) as Map<number, Map<number | bigint, string>>;
    let networks = byBits.get(network.bits);
    if (!networks) byBits.set(network.bits, (networks = new Map()));
    if (!networks.has(network.value)) held.size += 1;
    networks.set(network.value, identity);
  }

  remove(scope: string, identity: string): void {
    const network = networkOf(identity);
    const held = network && this.byScope.get(scope);
    if (!network || !held) return;
    const byBits = (network.family === 4 ? held.v4 : held.v6) as Map<number, Map<number | bigint, string>>;
    const networks = byBits.get(network.bits);
    if (!networks?.delete(network.value)) return;
    if (networks.size === 0) byBits.delete(network.bits);
    held.size -= 1;
    if (held.size === 0) this.byScope.delete(scope);
  }

  clear(): void {
    this.byScope.clear();
  }

  holdsAny(scope: string): boolean {
    return this.byScope.has(scope);
  }

  /** Calls `found` with the identity of each network of the scope that holds this address (or network). */
  forEachHolding(scope: string, identity: string, found: (network: string) => void): void {
    const held = this.byScope.get(scope);
    if (!held) return;
    const address = addressBits(identity);
    if (!address) return;
    if (address.family === 4) {
      for (const [bits, networks] of held.v4) {
        const network = bits <= address.bits ? networks.get(masked4(address.value, bits)) : undefined;
        if (network !== undefined) found(network);
      }
      return;
    }
    for (const [bits, networks] of held.v6) {
      const network = bits <= address.bits ? networks.get(masked6(address.value, bits)) : undefined;
      if (network !== undefined) found(network);
    }
  }
}

/** An entry's identity read as a network; a single address (matched as it is) is none. */
function networkOf(identity: string): AddressBits | undefined {
  return identity.includes('/') ? addressBits(identity) : undefined;
}

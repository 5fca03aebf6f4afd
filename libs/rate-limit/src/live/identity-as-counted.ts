import { isIP, isIPv4 } from 'node:net';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { clientAddressIdentity } from '../store/key-layout.js';
import { addressBits } from './banned-networks.js';

/** How the rules an entry reaches count a client address, and what the entry may be. */
export interface CountingOfEntry {
  /** The `ipv6PrefixBits` of each rule reached that counts by client address (for `'*'`: every rule). */
  prefixBits: readonly number[];
  /** Every rule reached counts by client address: anything but an address or a network matches no request. */
  addressesOnly: boolean;
  /** What counts by address only, for the message: `rule "X"`, `every rule`. */
  subject: string;
  /** Whether a network stands for every address in it (bans); else an entry is for one client (overrides). */
  networks: boolean;
  /**
   * Take what cannot be refused now as given (unban, deleteOverride): an entry an earlier version
   * wrote that way must still be removable.
   */
  lenient?: boolean;
}

/**
 * Text a client address looks like but that is no address as Node reads one (so as no request's
 * client is): parts with leading zeros (`010.0.0.1`), in hex (`0x0a000001`), too few (`10.1`), or
 * one number (`167772161`), with or without a prefix length.
 */
const ADDRESS_LOOKALIKE = /^(?:0x[0-9a-f]+|\d+)(?:\.(?:0x[0-9a-f]+|\d+)){0,3}(?:\/\d+)?$/i;

/**
 * The identity as rules count it, for a ban or an override: an address where rules count by client
 * address as `clientAddressIdentity` keys it for requests (IPv4-mapped as IPv4, IPv6 per its
 * `ipv6PrefixBits` prefix), so the entry meets them; a network (bans) in its one spelling
 * (`203.0.113.0/24`; an IPv6 one no wider than the prefix counted is that prefix); anything else as
 * given. Throws, naming the forms taken, for what would match no request: text an address looks
 * like but is not (`010.0.0.1`, `0x0a000001`, `10.1`, a whole number where every rule counts by
 * address), anything but an address where every rule counts by address, a prefix length out of
 * range, and an address the apps sharing the entries count differently (their `ipv6PrefixBits`
 * differ), which no one entry would reach.
 */
export function identityAsCounted(identity: string, method: string, counting: CountingOfEntry): string {
  const subject = `RateLimitManagementService.${method}`;
  if (typeof identity !== 'string' || identity === '' || identity.length > 512) {
    throw new RateLimitConfigurationError(
      `${subject}: 'identity' must be a non-empty string of at most 512 characters`,
    );
  }
  const refuse = (problem: string) => {
    throw new RateLimitConfigurationError(`${subject}: ${problem}; ${acceptedForms(counting.networks)}`);
  };
  const { prefixBits } = counting;
  let forms: string[];
  if (isIP(identity) !== 0) forms = prefixBits.map((bits) => clientAddressIdentity(identity, bits));
  else {
    const network = networkForms(identity, counting);
    if (typeof network === 'string') {
      if (!counting.lenient) refuse(network);
      return identity;
    }
    if (network) forms = network;
    else {
      if (counting.lenient) return identity;
      const number = /^\d+$/.test(identity);
      if (ADDRESS_LOOKALIKE.test(identity) && (counting.addressesOnly || !number)) {
        refuse(`'identity' ${JSON.stringify(identity)} is not an address as written (no request's client is)`);
      }
      if (counting.addressesOnly) {
        refuse(
          `'identity' ${JSON.stringify(identity)} is no address, and ${counting.subject} counts by client address`,
        );
      }
      return identity;
    }
  }
  const distinct = [...new Set(forms)];
  if (distinct.length > 1) {
    throw new RateLimitConfigurationError(
      `${subject}: the apps this reaches count address ${identity} as ${distinct.join(' and ')} (their ipv6PrefixBits differ); give a rule of one of them`,
    );
  }
  return distinct[0] ?? identity;
}

/**
 * A network's spelling as counted, one per rule's `ipv6PrefixBits`; a string: why it is refused;
 * undefined: the identity is no network.
 */
function networkForms(identity: string, counting: CountingOfEntry): string[] | string | undefined {
  const slash = identity.indexOf('/');
  if (slash < 0) return undefined;
  const head = identity.slice(0, slash);
  const family = isIP(head);
  if (family === 0) return undefined;
  const network = addressBits(identity);
  if (!network) {
    return `${JSON.stringify(identity)}: a prefix length is /0 to /${family === 4 ? 32 : 128} for IPv${family}`;
  }
  if (network.family === 6 && network.bits >= 96) {
    // ::ffff:a.b.c.d/n, an IPv4 network written as IPv6, is counted as the IPv4 one.
    const v4 = clientAddressIdentity(head, 128);
    if (isIPv4(v4)) return networkForms(`${v4}/${network.bits - 96}`, counting);
  }
  if (network.family === 4) {
    const { value, bits } = network;
    const dotted = [value >>> 24, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff].join('.');
    if (bits === 32) return [dotted];
    if (!counting.networks) return `${JSON.stringify(identity)} is a network, and an override is for one client`;
    return [`${dotted}/${bits}`];
  }
  const counted = counting.prefixBits.length > 0 ? counting.prefixBits : [128];
  if (!counting.networks && counted.some((prefix) => network.bits < prefix)) {
    return `${JSON.stringify(identity)} is wider than the prefix the apps count an IPv6 client by (/${Math.max(...counted)}), and an override is for one client`;
  }
  return counted.map((prefix) => clientAddressIdentity(head, Math.min(prefix, network.bits)));
}

function acceptedForms(networks: boolean): string {
  return networks
    ? 'give an IPv4 address in four decimal parts without leading zeros (203.0.113.7), an IPv6 address (2001:db8::7), or a network of either (203.0.113.0/24, 2001:db8::/48)'
    : 'give an IPv4 address in four decimal parts without leading zeros (203.0.113.7) or an IPv6 address (2001:db8::7)';
}

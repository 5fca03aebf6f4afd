import { describe, expect, it } from 'vitest';
import { clientAddressIdentity } from './key-layout.js';

describe('clientAddressIdentity', () => {
  it('keeps IPv4 and unwraps IPv4-mapped IPv6', () => {
    expect(clientAddressIdentity('203.0.113.7', 64)).toBe('203.0.113.7');
    expect(clientAddressIdentity('::ffff:127.0.0.1', 64)).toBe('127.0.0.1');
    expect(clientAddressIdentity('::FFFF:1.2.3.4', 64)).toBe('1.2.3.4');
    expect(clientAddressIdentity('0:0:0:0:0:ffff:1.2.3.4', 64)).toBe('1.2.3.4');
    expect(clientAddressIdentity('::ffff:102:304', 64)).toBe('1.2.3.4');
    expect(clientAddressIdentity('::ffff:102:305', 128)).toBe('1.2.3.5');
  });

  it('groups IPv6 addresses by prefix, so rotating within a /64 shares one identity', () => {
    const a = clientAddressIdentity('2001:db8:1:2:aaaa:bbbb:cccc:dddd', 64);
    const b = clientAddressIdentity('2001:0db8:0001:0002::1', 64);
    expect(a).toBe('2001:db8:1:2::/64');
    expect(b).toBe(a);
    expect(clientAddressIdentity('2001:db8:1:3::1', 64)).not.toBe(a);
  });

  it('handles other prefix lengths, compressed forms, embedded IPv4 and zone indexes', () => {
    expect(clientAddressIdentity('2001:db8:abcd:12ff::1', 56)).toBe('2001:db8:abcd:1200::/56');
    expect(clientAddressIdentity('::1', 64)).toBe('::/64');
    expect(clientAddressIdentity('fe80::1%eth0', 64)).toBe('fe80::/64');
    expect(clientAddressIdentity('64:ff9b::192.0.2.33', 96)).toBe('64:ff9b::/96');
    expect(clientAddressIdentity('2001:db8::1', 128)).toBe('2001:db8::1');
  });
});

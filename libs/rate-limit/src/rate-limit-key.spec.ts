import { describe, expect, it } from 'vitest';
import { rateLimitKey } from './rate-limit-key.js';

describe('rateLimitKey', () => {
  it('uses short plain identities as they are', () => {
    expect(rateLimitKey('rl', 'Orders.list', '10.0.0.1')).toBe('rl:Orders.list:10.0.0.1');
    expect(rateLimitKey('rl', 'r', '::ffff:127.0.0.1')).toBe('rl:r:::ffff:127.0.0.1');
  });

  it('replaces identities that could pick a slot, break a line or grow the key by a digest', () => {
    const hostile = ['{slot}', 'a\nb', 'x'.repeat(10_000), 'ünïcode', 'a b', 'x'.repeat(65)];
    const keys = hostile.map((identity) => rateLimitKey('rl', 'r', identity));
    for (const key of keys) {
      expect(key).toMatch(/^rl:r:#[A-Za-z0-9_-]{43}$/);
    }
    expect(new Set(keys).size).toBe(hostile.length);
  });

  it('never maps a plain identity and a digested one to the same key', () => {
    const digested = rateLimitKey('rl', 'r', '{x}');
    const identityPart = digested.slice('rl:r:'.length);
    expect(rateLimitKey('rl', 'r', identityPart)).not.toBe(digested);
  });
});

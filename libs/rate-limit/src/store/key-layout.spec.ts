import { describe, expect, it } from 'vitest';
import { identityPart, rateLimitKeys } from './key-layout.js';

describe('rateLimitKeys', () => {
  it('uses short plain identities as they are, as the hash tag', () => {
    expect(rateLimitKeys('rl', 'Orders.list', '10.0.0.1', 'fixed-window')).toEqual({
      key: 'rl:{10.0.0.1}:Orders.list:fw',
      blockKey: 'rl:{10.0.0.1}:Orders.list:block',
      markerKey: 'rl:{10.0.0.1}:Orders.list:mark',
      pendingKey: 'rl:{10.0.0.1}:Orders.list:pend',
    });
    expect(rateLimitKeys('rl', 'r', '2001:db8::/64', 'gcra').key).toBe(
      'rl:{#' + identityPart('2001:db8::/64').slice(1) + '}:r:gc',
    );
  });

  it('replaces identities that could pick a slot, break a line or grow the key by a digest', () => {
    const hostile = ['{slot}', 'a}b', 'a\nb', 'x'.repeat(10_000), 'ünïcode', 'a b', 'x'.repeat(65), 'a/b'];
    const keys = hostile.map((identity) => rateLimitKeys('rl', 'r', identity, 'sliding-log').key);
    for (const key of keys) {
      expect(key).toMatch(/^rl:\{#[A-Za-z0-9_-]{43}\}:r:sl$/);
    }
    expect(new Set(keys).size).toBe(hostile.length);
  });

  it('never maps a plain identity and a digested one to the same key', () => {
    const digested = identityPart('{x}');
    expect(identityPart(digested)).not.toBe(digested);
  });
});

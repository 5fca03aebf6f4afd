import { describe, expect, it } from 'vitest';
import { identityPart, keyIdOf, rateLimitKey, rateLimitKeys, ruleKeyId, ruleStateKey } from './key-layout.js';

describe('rateLimitKeys', () => {
  it('uses short plain identities as they are, as the hash tag', () => {
    expect(rateLimitKeys('rl', 'orders', '10.0.0.1', 'fixed-window')).toEqual({
      key: 'rl:{10.0.0.1}:orders:fw',
      blockKey: 'rl:{10.0.0.1}:orders:block',
      markerKey: 'rl:{10.0.0.1}:orders:mark',
      pendingKey: 'rl:{10.0.0.1}:orders:pend',
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

  it('names a rule by its short id: a default Controller.method name by its digest', () => {
    expect(rateLimitKeys('rl', 'PingController.ping', '127.0.0.1', 'fixed-window')).toEqual({
      key: 'rl:{127.0.0.1}:~fBUkyazd:fw',
      blockKey: 'rl:{127.0.0.1}:~fBUkyazd:block',
      markerKey: 'rl:{127.0.0.1}:~fBUkyazd:mark',
      pendingKey: 'rl:{127.0.0.1}:~fBUkyazd:pend',
    });
    expect(rateLimitKey('rl', 'PingController.ping', 'u', 'token-bucket')).toBe(
      ruleStateKey('rl', ruleKeyId('PingController.ping'), 'u', 'token-bucket'),
    );
  });

  it('keeps the keys beside a state key per rule', () => {
    const rules = ['login', 'PingController.ping', 'PingController.pong', 'PingController'];
    const blocks = rules.map((rule) => rateLimitKeys('rl', rule, 'u', 'fixed-window').blockKey);
    expect(new Set(blocks).size).toBe(rules.length);
  });
});

describe('ruleKeyId', () => {
  it('keeps names of at most 9 plain characters, no longer than a digest id', () => {
    for (const name of ['a', 'login', 'orders.v2', 'api_key-1', 'Pay$9']) expect(ruleKeyId(name)).toBe(name);
  });

  it('digests longer names, and names no rule may have, to ~ and 8 base64url characters', () => {
    const names = ['orders.v2x', 'PingController', 'PingController.ping', 'x'.repeat(64), 'a:b', '{a}', 'ünï', ''];
    const ids = names.map(ruleKeyId);
    for (const id of ids) expect(id).toMatch(/^~[A-Za-z0-9_-]{8}$/);
    expect(new Set(ids).size).toBe(names.length);
    // The same on every instance and deploy: a known answer, not a per-process value.
    expect(ruleKeyId('PingController.ping')).toBe('~fBUkyazd');
  });

  it('gives some names one id: 48 bits meet by chance among millions of names', () => {
    // Found by searching 60 million names; the rule registry refuses such a pair at bootstrap.
    expect(ruleKeyId('collide-11hof')).toBe(ruleKeyId('collide-l2eq3'));
  });

  it('is found again in every key of the layout', () => {
    for (const name of ['login', 'PingController.ping']) {
      const keys = rateLimitKeys('rl:app', name, '2001:db8::1', 'sliding-window');
      for (const key of Object.values(keys)) expect(keyIdOf(key)).toBe(ruleKeyId(name));
    }
  });
});

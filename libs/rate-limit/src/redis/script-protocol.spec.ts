import { describe, expect, expectTypeOf, it } from 'vitest';
import type { RateLimitHit } from '../store/rate-limit-store.js';
import { bits, type LayoutDeclaration } from './script-layout.js';
import { luaStringTable } from './script-layout-lua.js';
import { defineScriptLayout } from './script-protocol.js';
import { ALGORITHM_NAMES } from '../algorithms/algorithm.js';
import { CONSUME_LAYOUT, CONSUME_SCRIPTS, decodeConsume, encodeConsume } from './scripts/consume.script.js';
import { RAISE_LAYOUT, RAISE_SCRIPTS } from './scripts/raise.script.js';
import { REFUND_LAYOUT, REFUND_SCRIPTS, encodeRefund } from './scripts/refund.script.js';

const hit = (key: string, overrides: Partial<RateLimitHit> = {}): RateLimitHit => ({
  key,
  algorithm: 'fixed-window',
  limit: 10,
  windowMs: 60_000,
  cost: 1,
  burst: 10,
  blockMs: 0,
  conditional: false,
  ...overrides,
});

/** Every name a part of a declaration gives, keys and args alike. */
function declaredNames(part: LayoutDeclaration['head']): string[] {
  return [...(part?.keys ?? []), ...Object.keys(part?.args ?? {})];
}

describe('script layouts', () => {
  it('round-trips a consume call and its reply through the encoders and decoders', () => {
    const head = { now: 1_700_000_000_123, nonce: 'abc:1' };
    const rules = [
      {
        key: 'p:{u}:a:fw',
        blockKey: 'p:{u}:a:block',
        markerKey: 'p:{u}:a:mark',
        pendingKey: 'p:{u}:a:pend',
        alg: 'fixed-window',
        limit: 10,
        window: 60_000,
        cost: 2,
        burst: 10,
        block: 5_000,
        force: false,
        markFrom: 8,
        conditional: true,
        overdraft: -1,
        settles: '',
        within: 0,
      },
      {
        key: 'p:{u}:b:gc',
        blockKey: 'p:{u}:b:block',
        markerKey: 'p:{u}:b:mark',
        pendingKey: 'p:{u}:b:pend',
        alg: 'gcra',
        limit: 3,
        window: 1_000,
        cost: 0,
        burst: 5,
        block: 0,
        force: true,
        markFrom: 0,
        conditional: false,
        overdraft: 30,
        settles: '17',
        within: 250,
      },
    ];
    expect(CONSUME_LAYOUT.decodeCall(CONSUME_LAYOUT.encode(head, rules))).toEqual({
      head,
      rules,
    });

    const replyHead = { allowed: false, now: 1_700_000_000_123 };
    const replyRules = [
      { allowed: true, remaining: 7, reset: 59_000, provisional: false, repaired: true, unrecorded: false },
      { allowed: false, remaining: 0, reset: 333, provisional: true, repaired: false, unrecorded: false },
    ];
    const reply = CONSUME_LAYOUT.encodeReply(replyHead, replyRules);
    expect(CONSUME_LAYOUT.decode(reply, 2)).toEqual({ head: replyHead, rules: replyRules });
  });

  it('encodes the store hits and decodes the reply the store reads', () => {
    const hits = [hit('p:{u}:a:fw', { conditional: true }), hit('p:{u}:b:tb', { algorithm: 'token-bucket' })];
    const call = CONSUME_LAYOUT.decodeCall(
      encodeConsume({ now: undefined, nonce: 'n1', hits, record: false, sentAt: 0, markerShare: 0.8 }),
    );
    expect(call.head).toMatchObject({ now: -1, nonce: 'n1' });
    expect(call.rules.map((rule) => [rule.key, rule.pendingKey, rule.alg, rule.markFrom, rule.conditional])).toEqual([
      ['p:{u}:a:fw', 'p:{u}:a:pend', 'fixed-window', 8, true],
      ['p:{u}:b:tb', 'p:{u}:b:pend', 'token-bucket', 0, false],
    ]);
    // Recording counts without deciding, so no rule waits on units in flight.
    const recorded = CONSUME_LAYOUT.decodeCall(
      encodeConsume({ now: 5, nonce: 'n2', hits, record: true, sentAt: 5, markerShare: false }),
    );
    expect(recorded.rules.map((rule) => [rule.force, rule.conditional, rule.markFrom])).toEqual([
      [true, false, 0],
      [true, false, 0],
    ]);

    const reply = CONSUME_LAYOUT.encodeReply({ allowed: true, now: 5 }, [
      { allowed: true, remaining: 9, reset: 100, provisional: false, repaired: false, unrecorded: false },
      { allowed: true, remaining: 0, reset: 7, provisional: true, repaired: true, unrecorded: false },
    ]);
    expect(decodeConsume(reply, 2)).toEqual({
      allowed: true,
      now: 5,
      rules: [
        { allowed: true, remaining: 9, resetMs: 100, provisional: false, repaired: false, unrecorded: false },
        { allowed: true, remaining: 0, resetMs: 7, provisional: true, repaired: true, unrecorded: false },
      ],
    });
  });

  it('sends as many entries as the head plus the rules times their fields (and the rule count)', () => {
    const { head, rule } = CONSUME_LAYOUT.declaration;
    for (const n of [0, 1, 3]) {
      const hits = Array.from({ length: n }, (_, i) => hit(`p:{u}:r${i}:fw`));
      const { keys, args } = encodeConsume({ now: 1, nonce: 'x', hits, record: false, sentAt: 0, markerShare: false });
      expect(args).toHaveLength(Object.keys(head.args).length + 1 + n * Object.keys(rule.args).length);
      expect(keys).toHaveLength(n * rule.keys.length);
    }
    const settlements = [0, 1].map((i) => ({
      hit: hit(`p:{u}:r${i}:fw`),
      receipt: { admittedAt: 1, nonce: 'x' },
      refund: i === 0,
    }));
    const { keys, args } = encodeRefund(1, 'x', settlements);
    const refund = REFUND_LAYOUT.declaration;
    expect(args).toHaveLength(Object.keys(refund.head.args).length + 1 + 2 * Object.keys(refund.rule.args).length);
    expect(keys).toHaveLength(2 * refund.rule.keys.length);
    expect(REFUND_LAYOUT.decodeCall({ keys, args }).rules.map((rule) => rule.refund)).toEqual([true, false]);
  });

  it('generates Lua that reads every declared field by name and replies with every reply field', () => {
    for (const layout of [CONSUME_LAYOUT, REFUND_LAYOUT, RAISE_LAYOUT]) {
      const { head, rule, reply } = layout.declaration as LayoutDeclaration;
      for (const name of [...declaredNames(head), ...declaredNames(rule)]) {
        expect(layout.lua, `${layout.name}: ${name}`).toMatch(new RegExp(`\\b${name} = (tonumber\\()?(KEYS|ARGV)\\[`));
      }
      const replyFields = { ...reply?.head, ...reply?.rule };
      for (const [name, kind] of Object.entries(replyFields)) {
        for (const field of typeof kind === 'object' ? kind.bits : [name]) {
          expect(layout.lua, `${layout.name}: reply ${field}`).toContain(`t.${field}`);
        }
      }
    }
  });

  it('leaves no KEYS or ARGV position to the scripts themselves', () => {
    // Each variant by algorithms: each one alone, and all at once.
    const variants = [
      ...ALGORITHM_NAMES.map((algorithm) => [{ algorithm }]),
      ALGORITHM_NAMES.map((algorithm) => ({ algorithm })),
    ];
    for (const [layout, script] of [
      ...variants.map((hits) => [CONSUME_LAYOUT, CONSUME_SCRIPTS.for(hits)] as const),
      ...variants.map((hits) => [REFUND_LAYOUT, REFUND_SCRIPTS.for(hits)] as const),
      ...variants.map((hits) => [RAISE_LAYOUT, RAISE_SCRIPTS.for(hits)] as const),
    ]) {
      expect(script.source).toContain(layout.lua);
      expect(script.source.replace(layout.lua, ''), script.name).not.toMatch(/\b(KEYS|ARGV)\s*\[/);
    }
  });

  it('refuses a reply that does not fit the layout', () => {
    const reply = CONSUME_LAYOUT.encodeReply({ allowed: true, now: 1 }, [
      { allowed: true, remaining: 1, reset: 1, provisional: false, repaired: false, unrecorded: false },
    ]);
    expect(() => CONSUME_LAYOUT.decode(reply.slice(0, -1))).toThrow(/consume script replied 5 values/);
    expect(() => CONSUME_LAYOUT.decode(reply, 2)).toThrow(/for 2 rules/);
    expect(() => CONSUME_LAYOUT.decode('OK')).toThrow(/not an array/);
    expect(() => REFUND_LAYOUT.decode([1, 2])).toThrow(/refund script replied 2 values/);
  });

  it('packs named booleans into one reply integer, the first as bit 1', () => {
    const layout = defineScriptLayout('bits', { reply: { head: { state: bits('a', 'b', 'c') } } });
    expect(layout.encodeReply({ a: true, b: false, c: true })).toEqual([5]);
    expect(layout.decode([6]).head).toEqual({ a: false, b: true, c: true });
    expect(layout.lua).toContain('(t.a and 1 or 0) + (t.b and 2 or 0) + (t.c and 4 or 0)');
  });

  it('refuses names Lua could not take, or that collide', () => {
    expect(() => defineScriptLayout('x', { head: { args: { end: 'number' } } })).toThrow(/not a Lua identifier/);
    expect(() => defineScriptLayout('x', { rule: { keys: ['key'], args: { key: 'string' } } })).toThrow(/key twice/);
    // The rule count is read under `rules` in the head.
    expect(() => defineScriptLayout('x', { head: { args: { rules: 'number' } }, rule: {} })).toThrow(/rules twice/);
    expect(() => luaStringTable({ start: "s'" })).toThrow(/Not a plain Lua string/);
  });

  it('types the encoder input and the decoded reply from the declaration', () => {
    expectTypeOf(CONSUME_LAYOUT.decode).returns.toEqualTypeOf<{
      head: { allowed: boolean; now: number };
      rules: {
        allowed: boolean;
        remaining: number;
        reset: number;
        provisional: boolean;
        repaired: boolean;
        unrecorded: boolean;
      }[];
    }>();
    expectTypeOf(REFUND_LAYOUT.encode).parameter(0).toEqualTypeOf<{ at: number; nonce: string }>();
    expectTypeOf(RAISE_LAYOUT.encode).parameter(0).toEqualTypeOf<{
      key: string;
      alg: string;
      limit: number;
      window: number;
      cost: number;
      burst: number;
      now: number;
      start: number;
      figure: number;
      admissions: string;
    }>();
  });
});

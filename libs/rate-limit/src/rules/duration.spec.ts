import { describe, expect, it } from 'vitest';
import { MAX_DURATION_MS, parseCount, parseDuration } from './duration.js';
import { validateRule } from './rate-limit-rule.js';

describe('parseDuration', () => {
  it.each([
    [1, 1],
    [1_000, 1_000],
    ['250', 250],
    ['500ms', 500],
    ['1s', 1_000],
    ['1.5s', 1_500],
    [' 2 m ', 120_000],
    ['1h', 3_600_000],
    ['1d', 86_400_000],
    ['365d', 31_536_000_000],
    [MAX_DURATION_MS, 31_536_000_000],
  ])('reads %j as %d ms', (input, ms) => {
    expect(parseDuration(input)).toBe(ms);
  });

  it.each([
    0,
    -1,
    1.5,
    Number.NaN,
    Number.POSITIVE_INFINITY,
    '',
    '0s',
    '5 parsecs',
    '1w',
    '1.0001s',
    '-1s',
    null,
    undefined,
    {},
    MAX_DURATION_MS + 1,
    Number.MAX_SAFE_INTEGER,
    String(Number.MAX_SAFE_INTEGER),
    '366d',
    '8761h',
  ])('rejects %j', (input) => {
    expect(parseDuration(input)).toBeUndefined();
  });

  it('bounds the windows and penalties a decorator declares, as bootstrap checks them', () => {
    const declared = (options: object) => () => validateRule({ count: 1, window: '1s', ...options }, 'C.m', 'C.m');
    expect(declared({ window: Number.MAX_SAFE_INTEGER })).toThrow(/@RateLimit on C.m: 'window' must be/);
    expect(declared({ window: '366d' })).toThrow(/'window' must be/);
    expect(declared({ blockFor: '400d' })).toThrow(/'blockFor' must be a positive duration/);
    expect(declared({ window: '365d', blockFor: '365d' })()).toMatchObject({ windowMs: MAX_DURATION_MS });
  });
});

describe('parseCount', () => {
  it.each([
    [1, 1],
    [' 42 ', 42],
    ['7', 7],
  ])('reads %j as %d', (input, count) => {
    expect(parseCount(input)).toBe(count);
  });

  it.each([0, -3, 2.5, Number.NaN, '', 'ten', '1e3', '2.0', null, true])('rejects %j', (input) => {
    expect(parseCount(input)).toBeUndefined();
  });
});

import { describe, expect, it } from 'vitest';
import { MAX_DURATION_MS, parseCount, parseDuration, parseEndTime } from './duration.js';
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

describe('parseEndTime', () => {
  const now = Date.parse('2026-06-01T00:00:00Z');

  it.each([
    ['a Date', new Date(now + 60_000), now + 60_000],
    ['an ISO 8601 time', '2026-12-31T23:59Z', Date.parse('2026-12-31T23:59Z')],
    ['an ISO 8601 time with seconds and an offset', '2026-06-01T02:00:30+02:00', now + 30_000],
    ['an ISO 8601 date', '2026-06-02', now + 86_400_000],
    ['ms since the epoch', now + 1, now + 1],
    ['a duration with its unit', '10m', now + 600_000],
    ['a duration with spaces', ' 1.5 h ', now + 5_400_000],
    ['the longest duration', '365d', now + MAX_DURATION_MS],
  ])('reads %s', (_, value, at) => {
    expect(parseEndTime(value, now)).toEqual({ at });
  });

  it.each(['60', ' 60 ', '1.5', String(now + 60_000)])('refuses %j, digits without a unit, saying so', (value) => {
    expect(parseEndTime(value, now)).toEqual({ problem: expect.stringMatching(/^has no unit/) });
  });

  it.each([
    ['a number read as a duration before', 60_000],
    ['a time past', new Date(now - 1)],
    ['now', now],
    ['past 365 days', '366d'],
    ['a time past 365 days', '2099-01-01T00:00Z'],
    ['an invalid Date', new Date(Number.NaN)],
    ['words', 'next tuesday'],
    ['a date as Date.parse reads more loosely', 'Dec 25 2026'],
    ['a unit alone', 'm'],
    ['nothing', undefined],
    ['an object', {}],
  ])('refuses %s', (_, value) => {
    expect(parseEndTime(value, now)).toEqual({
      problem: expect.stringMatching(/^must be a time in the next 365 days: a Date, an ISO 8601 time/),
    });
  });
});

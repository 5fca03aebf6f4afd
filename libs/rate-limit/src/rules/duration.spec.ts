import { describe, expect, it } from 'vitest';
import { parseCount, parseDuration } from './duration.js';

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
  ])('rejects %j', (input) => {
    expect(parseDuration(input)).toBeUndefined();
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

import { describe, expect, it } from 'vitest';
import { parseLimitSettings } from './limit-settings.js';

describe('parseLimitSettings', () => {
  it.each(['__proto__', 'constructor', 'prototype'])("refuses '%s' as a field, as JSON brings it", (field) => {
    const parsed = parseLimitSettings(JSON.parse(`{"${field}":{"mode":"off"},"count":3}`));
    expect(parsed.settings).toEqual({ count: 3 });
    expect(parsed.unknown).toEqual([expect.stringMatching(new RegExp(`^'${field}' is not a setting`))]);
  });

  it('reads only the own fields of the values: none inherited from a prototype', () => {
    const polluted = Object.assign(Object.create({ mode: 'off', window: '1s' }) as object, { count: 3 });
    expect(parseLimitSettings(polluted)).toEqual({ settings: { count: 3 }, problems: [], unknown: [] });
  });

  it('takes a window of at most 365 days, and says so of a longer one', () => {
    expect(parseLimitSettings({ window: '365d' }).settings).toEqual({ windowMs: 31_536_000_000 });
    for (const window of [Number.MAX_SAFE_INTEGER, '366d']) {
      expect(parseLimitSettings({ window }).problems).toEqual([
        expect.stringMatching(/^'window' must be a positive duration of at most 365 days, such as 500 \(ms\)/),
      ]);
    }
  });
});

import { describe, expect, it } from 'vitest';
import { FIXED_WINDOW_LUA } from './fixed-window/fixed-window.lua.js';
import { SLIDING_WINDOW_LUA } from './sliding-window/sliding-window.lua.js';
import { STORED_FIELDS, STORED_TYPES } from './stored-fields.js';
import { TOKEN_BUCKET_LUA } from './token-bucket/token-bucket.lua.js';

const LUA = {
  'fixed-window': FIXED_WINDOW_LUA,
  'sliding-window': SLIDING_WINDOW_LUA,
  'token-bucket': TOKEN_BUCKET_LUA,
};

describe('stored fields', () => {
  it('keeps the letters state already in Redis was written with', () => {
    // The stored format, written out on purpose: a change here makes every existing key unreadable.
    expect(STORED_FIELDS).toEqual({
      'fixed-window': { start: 's', count: 'c' },
      'sliding-window': { window: 'w', index: 'i', current: 'c', previous: 'p' },
      'token-bucket': { tokens: 't', refilledAt: 'r' },
    });
  });

  it('gives each field of an algorithm its own letter', () => {
    for (const fields of Object.values(STORED_FIELDS)) {
      const letters = Object.values(fields);
      expect(new Set(letters).size).toBe(letters.length);
    }
  });

  it('lists exactly the algorithms whose state is a hash, and the fixed window, a hash on the app clock', () => {
    const hashes = Object.entries(STORED_TYPES).flatMap(([name, type]) => (type === 'hash' ? [name] : []));
    expect(STORED_TYPES['fixed-window']).toBe('string');
    expect(Object.keys(STORED_FIELDS).sort()).toEqual([...hashes, 'fixed-window'].sort());
  });

  it('leaves the Lua no field letter to write by hand', () => {
    for (const [name, fields] of Object.entries(STORED_FIELDS)) {
      const lua = LUA[name as keyof typeof LUA];
      // The one line that defines the Lua's table of fields, made from the same object.
      const [definition, ...others] = lua.split('\n').filter((line) => /^local \w+ = \{ \w+ = '/.test(line));
      expect(others, name).toEqual([]);
      for (const [field, letter] of Object.entries(fields)) expect(definition).toContain(`${field} = '${letter}'`);
      const rest = lua.replace(definition, '');
      for (const letter of Object.values(fields)) expect(rest, `${name}: '${letter}'`).not.toContain(`'${letter}'`);
    }
  });
});

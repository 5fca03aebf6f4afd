import { RedisScript } from '../script-runner.js';
import { keysBeside } from '../../store/key-layout.js';

/**
 * Deletes state keys and the keys beside them (a reset through the API): the identities start
 * afresh. The marker goes too, or a counter deleted would resume from it.
 *
 * KEYS: each state key and every key beside it, all in one hash slot. Not a positional layout: each
 * key is only deleted, so their order does not matter.
 */
export const RESET_SCRIPT = new RedisScript(
  'reset',
  `
for _, key in ipairs(KEYS) do redis.call('DEL', key) end
return #KEYS
`,
);

/** Every key of the given state keys: each, and all `keysBeside` it (so a key added there goes too). */
export function encodeReset(keys: readonly string[]): string[] {
  return keys.flatMap((key) => [key, ...Object.values(keysBeside(key))]);
}

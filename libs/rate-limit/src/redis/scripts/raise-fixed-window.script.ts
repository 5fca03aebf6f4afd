import { FIXED_WINDOW_FIELDS } from '../../algorithms/fixed-window/fields.js';
import { RedisScript } from '../redis-script.js';
import { defineScriptLayout, luaStringTable } from '../script-protocol.js';

/** The call and reply of RAISE_FIXED_WINDOW_SCRIPT: the state key, the window's start, the figure. */
export const RAISE_FIXED_WINDOW_LAYOUT = defineScriptLayout('raise-fixed-window', {
  head: { keys: ['key'], args: { start: 'number', figure: 'number' } },
  reply: { head: { raised: 'flag' } },
});

/**
 * Raises a fixed window's count to at least a figure an instance saw in it, after Redis reported
 * less (writes lost in a failover). "At least", so instances repairing at once never add up; and
 * only that window (by its start), never one that began since. It reads the hash the fixed window's
 * Lua writes, by the same fields.
 */
export const RAISE_FIXED_WINDOW_SCRIPT = new RedisScript(
  RAISE_FIXED_WINDOW_LAYOUT.name,
  `${RAISE_FIXED_WINDOW_LAYOUT.lua}
local FIXED_WINDOW = ${luaStringTable(FIXED_WINDOW_FIELDS)}
local function fmt(x) return string.format('%.17g', x) end
local call = readHead()
local st = redis.pcall('HMGET', call.key, FIXED_WINDOW.start, FIXED_WINDOW.count)
if st.err then return replyHead({ raised = false }) end
local start, count = tonumber(st[1]), tonumber(st[2])
if start == call.start and count and count < call.figure then
  redis.call('HSET', call.key, FIXED_WINDOW.count, fmt(call.figure))
  return replyHead({ raised = true })
end
return replyHead({ raised = false })
`,
);

export function encodeRaiseFixedWindow(key: string, windowStart: number, figure: number) {
  return RAISE_FIXED_WINDOW_LAYOUT.encode({ key, start: windowStart, figure });
}

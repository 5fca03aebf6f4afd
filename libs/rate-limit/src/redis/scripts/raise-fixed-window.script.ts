import { FIXED_WINDOW_FIELDS } from '../../algorithms/fixed-window/fields.js';
import { TTL_WINDOW_START_LUA } from '../../algorithms/fixed-window/fixed-window.lua.js';
import { RedisScript } from '../script-runner.js';
import { luaStringTable } from '../script-layout-lua.js';
import { defineScriptLayout } from '../script-protocol.js';

/** The call and reply of RAISE_FIXED_WINDOW_SCRIPT: the state key, the window's start and length, the figure. */
export const RAISE_FIXED_WINDOW_LAYOUT = defineScriptLayout('raise-fixed-window', {
  head: { keys: ['key'], args: { start: 'number', window: 'number', figure: 'number' } },
  reply: { head: { raised: 'flag' } },
});

/**
 * Raises a fixed window's count to at least a figure an instance saw in it, after Redis reported
 * less (writes lost in a failover). "At least", so instances repairing at once never add up; and
 * only that window, by its start, never one that began since. It reads the state in either form
 * the fixed window's Lua writes (`fixed-window.lua.ts`): an integer timed by its TTL, whose start
 * is its absolute end less the window (`ttlWindowStart`), or a hash that holds its start.
 */
export const RAISE_FIXED_WINDOW_SCRIPT = new RedisScript(
  RAISE_FIXED_WINDOW_LAYOUT.name,
  `${RAISE_FIXED_WINDOW_LAYOUT.lua}${TTL_WINDOW_START_LUA}
local FIXED_WINDOW = ${luaStringTable(FIXED_WINDOW_FIELDS)}
local call = readHead()
local kind = redis.call('TYPE', call.key).ok
if kind == 'string' then
  local start = ttlWindowStart(call.key, call.window)
  local count = tonumber(redis.call('GET', call.key))
  if start == call.start and count and count < call.figure then
    redis.call('SET', call.key, call.figure, 'KEEPTTL')
    return replyHead({ raised = true })
  end
  return replyHead({ raised = false })
end
if kind ~= 'hash' then return replyHead({ raised = false }) end
local st = redis.call('HMGET', call.key, FIXED_WINDOW.start, FIXED_WINDOW.count)
local start, count = tonumber(st[1]), tonumber(st[2])
if start == call.start and count and count < call.figure then
  redis.call('HSET', call.key, FIXED_WINDOW.count, string.format('%.17g', call.figure))
  return replyHead({ raised = true })
end
return replyHead({ raised = false })
`,
);

export function encodeRaiseFixedWindow(key: string, windowStart: number, windowMs: number, figure: number) {
  return RAISE_FIXED_WINDOW_LAYOUT.encode({ key, start: windowStart, window: windowMs, figure });
}

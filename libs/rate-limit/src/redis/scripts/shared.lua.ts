import {
  ALGORITHM_NAMES,
  MAX_WAIT_MS,
  ROUNDING_EPSILON,
  type RateLimitAlgorithmName,
} from '../../algorithms/algorithm.js';
import { FIXED_WINDOW_LUA } from '../../algorithms/fixed-window/fixed-window.lua.js';
import { GCRA_LUA } from '../../algorithms/gcra/gcra.lua.js';
import { SLIDING_LOG_LUA } from '../../algorithms/sliding-log/sliding-log.lua.js';
import { SLIDING_WINDOW_LUA } from '../../algorithms/sliding-window/sliding-window.lua.js';
import { TOKEN_BUCKET_LUA } from '../../algorithms/token-bucket/token-bucket.lua.js';
import { CLAIM_MS, GRACE_MS, type RateLimitHit } from '../../store/rate-limit-store.js';

/**
 * Helpers the consume and refund scripts share, then the Lua of the algorithms a script serves, as
 * the table ALG[name] = { check, commit, refund }. A script holds only the algorithms of the calls
 * it serves (`algorithmsLua`): Redis runs a script's whole body on every call, so every algorithm
 * defined there costs every call the time of building its functions.
 *
 * State is read through `read` and `num`, never trusted: a key of another type (WRONGTYPE: a bad
 * restore, another program writing under the prefix) is deleted and read as absent, a value that is
 * no finite number reads as absent, and a key found without a TTL is given one. Each sets `repaired`,
 * which the scripts report per rule. So a corrupt key costs only its own identity a fresh counter,
 * never an error reply that would count against Redis for every other request.
 *
 * `readFields` reads a hash by an algorithm's field table (`algorithms/<name>/fields.ts`), so the
 * Lua names each value as the TypeScript does and never by its position in an HMGET reply.
 * `pendingMember` is the member a `countOn` admission leaves in its rule's pending key: the consume
 * script adds it and the refund script removes it, so both build it here.
 */
/**
 * A rule's arguments that every algorithm's Lua reads (as `p.limit`, `p.window`, …): the first
 * args of each rule in the scripts that run algorithms (consume, refund), in this order.
 */
export const ALGORITHM_ARGS = {
  alg: 'string',
  limit: 'number',
  window: 'number',
  cost: 'number',
  burst: 'number',
} as const;

/** A hit's values for `ALGORITHM_ARGS`. */
export function algorithmArgs(hit: RateLimitHit) {
  return { alg: hit.algorithm, limit: hit.limit, window: hit.windowMs, cost: hit.cost, burst: hit.burst };
}

/** Lua: `redisTimeMs()`, Redis's clock in whole ms (`TIME`), as every script that needs it reads it. */
export const REDIS_TIME_LUA = `
local function redisTimeMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end`;

const HELPERS_LUA = `${REDIS_TIME_LUA}
local GRACE_MS = ${GRACE_MS}
local CLAIM_MS = ${CLAIM_MS}
local ROUNDING_EPSILON = ${ROUNDING_EPSILON}
local MAX_WAIT_MS = ${MAX_WAIT_MS}
local function fmt(x) return string.format('%.17g', x) end
local repaired = false
-- Whether the call runs on Redis's clock (no \`clock\` option): a fixed window is then timed by its key's TTL.
local TTL_WINDOWS = false
local function read(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    -- Any other error (OOM, say) is Redis failing, not the key: raised, and the state kept.
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
    redis.call('DEL', key)
    repaired = true
    return nil
  end
  return reply
end
local function write(command, key, ...)
  return read(command, key, ...) or redis.call(command, key, ...)
end
local function num(x)
  if not x then return nil end
  local v = tonumber(x)
  if v and v == v and v ~= math.huge and v ~= -math.huge then return v end
  repaired = true
  return nil
end
local function ensureTtl(key, ms)
  if redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, math.max(1, math.floor(ms)))
    repaired = true
  end
end
-- A hash's fields as numbers by name (\`fields\`: name -> stored field), each nil when absent or junk.
local function readFields(key, fields)
  local names, stored = {}, {}
  for name, field in pairs(fields) do
    names[#names + 1] = name
    stored[#stored + 1] = field
  end
  local values = read('HMGET', key, unpack(stored)) or {}
  local out = {}
  for i, name in ipairs(names) do out[name] = num(values[i]) end
  return out
end
local function pendingMember(nonce, cost) return nonce .. ':' .. cost end
-- The time of a call: the one it gives, or (negative) Redis's, when a fixed window is timed by its key's TTL.
local function callTime(given)
  if given >= 0 then return given end
  TTL_WINDOWS = true
  return redisTimeMs()
end
local ALG = {}`;

const ALGORITHM_LUA: Record<RateLimitAlgorithmName, string> = {
  'fixed-window': FIXED_WINDOW_LUA,
  'sliding-window': SLIDING_WINDOW_LUA,
  'sliding-log': SLIDING_LOG_LUA,
  'token-bucket': TOKEN_BUCKET_LUA,
  gcra: GCRA_LUA,
};

/** The helpers, then the given algorithms' Lua (in the order of `ALGORITHM_NAMES`, whatever the order given). */
export function algorithmsLua(algorithms: ReadonlySet<RateLimitAlgorithmName>): string {
  return [
    HELPERS_LUA,
    ...ALGORITHM_NAMES.filter((name) => algorithms.has(name)).map((name) => ALGORITHM_LUA[name]),
  ].join('\n');
}

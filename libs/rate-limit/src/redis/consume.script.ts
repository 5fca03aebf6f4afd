import { ROUNDING_EPSILON } from '../algorithms/algorithm.js';
import { FIXED_WINDOW_LUA } from './lua/fixed-window.lua.js';
import { GCRA_LUA } from './lua/gcra.lua.js';
import { SLIDING_LOG_LUA } from './lua/sliding-log.lua.js';
import { SLIDING_WINDOW_LUA } from './lua/sliding-window.lua.js';
import { TOKEN_BUCKET_LUA } from './lua/token-bucket.lua.js';
import { RedisScript } from './redis-script.js';

/** Keys outlive the time their state matters by this much, so a slow call never finds them gone. */
export const GRACE_MS = 1_000;

/** ARGV entries per rule, after the three leading ones. */
const ARGS_PER_RULE = 8;
const REFUND_ARGS_PER_RULE = 5;

/** Every algorithm's Lua, as the table ALG[name] = { check, commit, refund }. */
const ALGORITHMS_LUA = `
local GRACE_MS = ${GRACE_MS}
local ROUNDING_EPSILON = ${ROUNDING_EPSILON}
local function fmt(x) return string.format('%.17g', x) end
local ALG = {}
${FIXED_WINDOW_LUA}
${SLIDING_WINDOW_LUA}
${SLIDING_LOG_LUA}
${TOKEN_BUCKET_LUA}
${GCRA_LUA}`;

/**
 * Decides all rules of one request in one atomic call: every rule is checked first, without
 * writing; only if all admit does every rule's state move. A rejected request moves no counter;
 * it only sets the block key of a rule with `blockFor` that rejected it, and gives a TTL to any
 * key found without one (left over by older code).
 *
 * KEYS: per rule, its state key, its block key (the time a `blockFor` penalty ends) and its marker
 *       key (a fixed window's count once high), all in one hash slot.
 * ARGV: now in ms (negative: use Redis TIME), a nonce unique to the request, the number of rules,
 *       then per rule: algorithm, limit, window ms, cost, burst, block ms, and 1 to record the units
 *       without deciding (units the fallback admitted while Redis was out), else 0, and the count
 *       from which a fixed window also writes its marker (0: never).
 * Returns: all admitted (1/0), now, then per rule: admitted (1/0), remaining, reset ms.
 *
 * Each algorithm's Lua lives in `lua/<algorithm>.lua.ts`, next to its TypeScript twin's contract.
 */
export const CONSUME_SCRIPT = new RedisScript(
  'consume',
  `${ALGORITHMS_LUA}
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local nonce = ARGV[2]
local n = tonumber(ARGV[3])
local params, steps = {}, {}
local all = true
for i = 1, n do
  local b = 3 + (i - 1) * ${ARGS_PER_RULE}
  local p = { alg = ARGV[b + 1], limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]),
              cost = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]), block = tonumber(ARGV[b + 6]),
              force = ARGV[b + 7] == '1', markFrom = tonumber(ARGV[b + 8]), marker = KEYS[3 * i] }
  local algorithm = ALG[p.alg]
  if not algorithm then return redis.error_reply('unknown algorithm ' .. tostring(p.alg)) end
  -- A block key holds the time the penalty ends, so it follows the same clock as the counters.
  local blockedUntil = 0
  if p.block > 0 and not p.force then blockedUntil = tonumber(redis.call('GET', KEYS[3 * i - 1])) or 0 end
  local s
  if p.force then
    -- Recording units admitted elsewhere (the fallback, while Redis was out): count, never refuse.
    s = algorithm.check(KEYS[3 * i - 2], now, p)
    s.allowed = true
  elseif blockedUntil > now then
    s = { allowed = false, remaining = 0, reset = blockedUntil - now, blocked = true }
  else
    s = algorithm.check(KEYS[3 * i - 2], now, p)
  end
  params[i], steps[i] = p, s
  if not s.allowed then all = false end
end
local out = { all and 1 or 0, now }
for i = 1, n do
  local p, s, key = params[i], steps[i], KEYS[3 * i - 2]
  if all then
    ALG[p.alg].commit(key, now, p, s, nonce)
  else
    if not s.allowed and not s.blocked and p.block > 0 then
      redis.call('SET', KEYS[3 * i - 1], fmt(now + p.block), 'PX', p.block + GRACE_MS)
      s.reset = math.max(s.reset, p.block)
    end
    if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, p.window + GRACE_MS) end
  end
  out[#out + 1] = s.allowed and 1 or 0
  out[#out + 1] = s.remaining
  out[#out + 1] = s.reset
end
return out
`,
);

/**
 * Takes back the units of hits admitted together by one CONSUME_SCRIPT call: for refunds
 * (`countOn`), and on Cluster for the slots that admitted a request another slot rejected.
 *
 * KEYS: per rule, its state key.
 * ARGV: the `now` that CONSUME_SCRIPT returned, its nonce, the number of rules, then per rule:
 *       algorithm, limit, window ms, cost, burst.
 */
export const REFUND_SCRIPT = new RedisScript(
  'refund',
  `${ALGORITHMS_LUA}
local at, nonce, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 1, n do
  local b = 3 + (i - 1) * ${REFUND_ARGS_PER_RULE}
  local p = { alg = ARGV[b + 1], limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]),
              cost = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]) }
  ALG[p.alg].refund(KEYS[i], at, p, nonce)
end
return n
`,
);

/**
 * Raises a fixed window's count to at least a figure an instance saw in it, after Redis reported
 * less (writes lost in a failover). "At least", so instances repairing at once never add up; and
 * only that window (by its start), never one that began since.
 *
 * KEYS: the state key. ARGV: the window's start (store time), the figure.
 */
export const RAISE_FIXED_WINDOW_SCRIPT = new RedisScript(
  'raise-fixed-window',
  `
local function fmt(x) return string.format('%.17g', x) end
local start, figure = tonumber(ARGV[1]), tonumber(ARGV[2])
local st = redis.call('HMGET', KEYS[1], 's', 'c')
if tonumber(st[1]) == start and tonumber(st[2]) and tonumber(st[2]) < figure then
  redis.call('HSET', KEYS[1], 'c', fmt(figure))
  return 1
end
return 0
`,
);

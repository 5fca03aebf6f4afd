import { ROUNDING_EPSILON } from '../../algorithms/algorithm.js';
import { FIXED_WINDOW_LUA } from '../../algorithms/fixed-window/fixed-window.lua.js';
import { GCRA_LUA } from '../../algorithms/gcra/gcra.lua.js';
import { SLIDING_LOG_LUA } from '../../algorithms/sliding-log/sliding-log.lua.js';
import { SLIDING_WINDOW_LUA } from '../../algorithms/sliding-window/sliding-window.lua.js';
import { TOKEN_BUCKET_LUA } from '../../algorithms/token-bucket/token-bucket.lua.js';
import { RedisScript } from '../redis-script.js';
import { GRACE_MS, type RateLimitHit, type RateLimitSettlement } from '../../store/rate-limit-store.js';
import { keysBeside } from '../../store/key-layout.js';
import { markerFrom } from '../failover/lost-write-marker.js';


/** KEYS and ARGV entries per rule, after the three leading ARGV entries. */
const KEYS_PER_RULE = 4;
const ARGS_PER_RULE = 9;
const REFUND_KEYS_PER_RULE = 2;
const REFUND_ARGS_PER_RULE = 6;

/**
 * Helpers every script shares, then every algorithm's Lua as the table ALG[name] = { check, commit,
 * refund }.
 *
 * State is read through `read` and `num`, never trusted: a key of another type (WRONGTYPE: a bad
 * restore, another program writing under the prefix) is deleted and read as absent, a value that is
 * no finite number reads as absent, and a key found without a TTL is given one. Each sets `repaired`,
 * which the scripts report per rule. So a corrupt key costs only its own identity a fresh counter,
 * never an error reply that would count against Redis for every other request.
 */
const ALGORITHMS_LUA = `
local GRACE_MS = ${GRACE_MS}
local ROUNDING_EPSILON = ${ROUNDING_EPSILON}
local function fmt(x) return string.format('%.17g', x) end
local repaired = false
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
local ALG = {}
${FIXED_WINDOW_LUA}
${SLIDING_WINDOW_LUA}
${SLIDING_LOG_LUA}
${TOKEN_BUCKET_LUA}
${GCRA_LUA}`;

/**
 * Decides all rules of one request in one atomic call: every rule is checked first, without
 * writing; only if all admit does every rule's state move. A rejected request moves no counter;
 * it only sets the block key of a rule with `blockFor` that rejected it, and mends keys it found
 * corrupt or without a TTL.
 *
 * A `countOn` rule's admissions stay in flight until the response settles (REFUND_SCRIPT ends them):
 * its pending key holds one member per admission, `nonce:cost`, scored by its time. A rejection that
 * the rule would not make but for units still in flight is provisional: it starts no penalty, since
 * those units may yet be refunded, and the caller may wait for them and ask again.
 *
 * KEYS: per rule, its state key, its block key (the time a `blockFor` penalty ends), its marker key
 *       (a fixed window's count once high) and its pending key, all in one hash slot.
 * ARGV: now in ms (negative: use Redis TIME), a nonce unique to the request, the number of rules,
 *       then per rule: algorithm, limit, window ms, cost, burst, block ms, 1 to record the units
 *       without deciding (units the fallback admitted while Redis was out) else 0, the count from
 *       which a fixed window also writes its marker (0: never), and 1 for a `countOn` rule else 0.
 * Returns: all admitted (1/0), now, then per rule: admitted (1/0), remaining, reset ms, and flags
 *          (1: a provisional rejection, 2: a key of the rule was repaired).
 *
 * Each algorithm's Lua lives in `lua/<algorithm>.lua.ts`, next to its TypeScript twin's contract.
 */
export const CONSUME_SCRIPT = new RedisScript(
  'consume',
  `${ALGORITHMS_LUA}
-- The end of a rule's penalty, or 0. A block key found without a TTL (left by older code or a bad
-- restore) gets one no longer than the rule's penalty, whatever end it claims: no ban for ever.
local function blockedUntil(key, now, p)
  local raw = read('GET', key)
  if not raw then return 0 end
  local ends = num(raw)
  if not ends then
    redis.call('DEL', key)
    return 0
  end
  ensureTtl(key, math.min(math.max(0, ends - now), p.block) + GRACE_MS)
  return ends
end
-- Units of a rule's admissions still in flight that a refund could give back: admitted since
-- \`since\` (a fixed window's start: one admitted in an earlier window is refunded into nothing).
-- Ones older than a window hold none and are dropped.
local function inFlightUnits(key, now, p, since)
  read('ZREMRANGEBYSCORE', key, '-inf', now - p.window)
  ensureTtl(key, p.window + GRACE_MS)
  local units = 0
  for _, member in ipairs(read('ZRANGEBYSCORE', key, since, '+inf') or {}) do
    units = units + (tonumber(string.match(member, ':(%d+)$')) or 0)
  end
  return units
end
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
  local b, k = 3 + (i - 1) * ${ARGS_PER_RULE}, (i - 1) * ${KEYS_PER_RULE}
  local p = { alg = ARGV[b + 1], limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]),
              cost = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]), block = tonumber(ARGV[b + 6]),
              force = ARGV[b + 7] == '1', markFrom = tonumber(ARGV[b + 8]), conditional = ARGV[b + 9] == '1',
              key = KEYS[k + 1], blockKey = KEYS[k + 2], marker = KEYS[k + 3], pending = KEYS[k + 4] }
  local algorithm = ALG[p.alg]
  if not algorithm then return redis.error_reply('unknown algorithm ' .. tostring(p.alg)) end
  repaired = false
  -- A block key holds the time the penalty ends, so it follows the same clock as the counters.
  local ends = 0
  if p.block > 0 and not p.force then ends = blockedUntil(p.blockKey, now, p) end
  local s
  if p.force then
    -- Recording units admitted elsewhere (the fallback, while Redis was out): count, never refuse.
    s = algorithm.check(p.key, now, p)
    s.allowed = true
  elseif ends > now then
    s = { allowed = false, remaining = 0, reset = ends - now, blocked = true }
  else
    s = algorithm.check(p.key, now, p)
    if not s.allowed and p.conditional then
      local inFlight = inFlightUnits(p.pending, now, p, s.start or (now - p.window + 1))
      if inFlight > 0 then
        local without = {}
        for name, value in pairs(p) do without[name] = value end
        without.cost = math.max(0, p.cost - inFlight)
        s.provisional = algorithm.check(p.key, now, without).allowed
      end
    end
  end
  s.repaired = repaired
  params[i], steps[i] = p, s
  if not s.allowed then all = false end
end
local out = { all and 1 or 0, now }
for i = 1, n do
  local p, s = params[i], steps[i]
  repaired = false
  if all then
    ALG[p.alg].commit(p.key, now, p, s, nonce)
    if p.conditional and not p.force then
      -- Admissions whose settle never came (a failed call, a crashed instance) hold nothing after a window.
      write('ZREMRANGEBYSCORE', p.pending, '-inf', now - p.window)
      redis.call('ZADD', p.pending, now, nonce .. ':' .. p.cost)
      redis.call('PEXPIRE', p.pending, p.window + GRACE_MS)
    end
  else
    if not s.allowed and not s.blocked and not s.provisional and p.block > 0 then
      redis.call('SET', p.blockKey, fmt(now + p.block), 'PX', p.block + GRACE_MS)
      s.reset = math.max(s.reset, p.block)
    end
    -- As long as the state matters: what the check says, and two windows at least.
    ensureTtl(p.key, math.max(s.ttl or 0, 2 * p.window) + GRACE_MS)
  end
  out[#out + 1] = s.allowed and 1 or 0
  out[#out + 1] = s.remaining
  out[#out + 1] = s.reset
  out[#out + 1] = (s.provisional and 1 or 0) + ((s.repaired or repaired) and 2 or 0)
end
return out
`,
);

/**
 * Ends admissions of one CONSUME_SCRIPT call: the response settled (a `countOn` rule's admission is
 * no longer in flight) and, where asked, the units are taken back: for refunds (`countOn`), and on
 * Cluster for the slots that admitted a request another slot rejected.
 *
 * KEYS: per rule, its state key and its pending key.
 * ARGV: the `now` that CONSUME_SCRIPT returned, its nonce, the number of rules, then per rule:
 *       algorithm, limit, window ms, cost, burst, and 1 to take the units back else 0.
 */
export const REFUND_SCRIPT = new RedisScript(
  'refund',
  `${ALGORITHMS_LUA}
local at, nonce, n = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for i = 1, n do
  local b, k = 3 + (i - 1) * ${REFUND_ARGS_PER_RULE}, (i - 1) * ${REFUND_KEYS_PER_RULE}
  local p = { alg = ARGV[b + 1], limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]),
              cost = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]) }
  read('ZREM', KEYS[k + 2], nonce .. ':' .. p.cost)
  if ARGV[b + 6] == '1' then ALG[p.alg].refund(KEYS[k + 1], at, p, nonce) end
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
local st = redis.pcall('HMGET', KEYS[1], 's', 'c')
if st.err then return 0 end
if tonumber(st[1]) == start and tonumber(st[2]) and tonumber(st[2]) < figure then
  redis.call('HSET', KEYS[1], 'c', fmt(figure))
  return 1
end
return 0
`,
);

/** One CONSUME_SCRIPT call: the hits of one hash slot. */
export interface ConsumeCall {
  /** Whole ms, or undefined for Redis `TIME`. */
  now: number | undefined;
  nonce: string;
  hits: readonly RateLimitHit[];
  /** Count the units without deciding (units the fallback admitted while Redis was out). */
  record: boolean;
  /** The lost-write marker's share of the limit, or false for none. */
  markerShare: number | false;
}

export function encodeConsume(call: ConsumeCall): { keys: string[]; args: (string | number)[] } {
  const keys: string[] = [];
  const args: (string | number)[] = [call.now ?? -1, call.nonce, call.hits.length];
  for (const hit of call.hits) {
    const { blockKey, markerKey, pendingKey } = keysBeside(hit.key);
    keys.push(hit.key, blockKey, markerKey, pendingKey);
    args.push(
      hit.algorithm,
      hit.limit,
      hit.windowMs,
      hit.cost,
      hit.burst,
      hit.blockMs,
      call.record ? 1 : 0,
      markerFrom(call.markerShare, hit),
      hit.conditional && !call.record ? 1 : 0,
    );
  }
  return { keys, args };
}

/** One rule's part of a CONSUME_SCRIPT reply. */
export interface ConsumeRuleReply {
  allowed: boolean;
  remaining: number;
  resetMs: number;
  provisional: boolean;
  /** A key of the rule was found corrupt or without a TTL and mended. */
  repaired: boolean;
}

export interface ConsumeReply {
  allowed: boolean;
  /** Redis's time of the decision (or the given `now`). */
  now: number;
  rules: ConsumeRuleReply[];
}

export function decodeConsume(reply: unknown, rules: number): ConsumeReply {
  const values = reply as number[];
  return {
    allowed: values[0] === 1,
    now: values[1],
    rules: Array.from({ length: rules }, (_, i) => {
      const at = 2 + i * 4;
      return {
        allowed: values[at] === 1,
        remaining: values[at + 1],
        resetMs: values[at + 2],
        provisional: (values[at + 3] & 1) !== 0,
        repaired: (values[at + 3] & 2) !== 0,
      };
    }),
  };
}

/** One REFUND_SCRIPT call: settlements of one slot and one admission (`admittedAt`, nonce). */
export function encodeRefund(
  admittedAt: number,
  nonce: string,
  settlements: readonly RateLimitSettlement[],
): { keys: string[]; args: (string | number)[] } {
  const keys: string[] = [];
  const args: (string | number)[] = [admittedAt, nonce, settlements.length];
  for (const { hit, refund } of settlements) {
    keys.push(hit.key, keysBeside(hit.key).pendingKey);
    args.push(hit.algorithm, hit.limit, hit.windowMs, hit.cost, hit.burst, refund ? 1 : 0);
  }
  return { keys, args };
}

/**
 * Deletes state keys and the keys beside them (a reset through the API): the identities start
 * afresh. The marker goes too, or a counter deleted would resume from it.
 *
 * KEYS: per state key, it and its block, marker and pending keys, all in one hash slot.
 */
export const RESET_SCRIPT = new RedisScript(
  'reset',
  `
for _, key in ipairs(KEYS) do redis.call('DEL', key) end
return #KEYS
`,
);

export function encodeReset(keys: readonly string[]): string[] {
  return keys.flatMap((key) => {
    const { blockKey, markerKey, pendingKey } = keysBeside(key);
    return [key, blockKey, markerKey, pendingKey];
  });
}

import { markerFrom } from '../failover/lost-write-marker.js';
import { RedisScript, ScriptsByAlgorithms } from '../redis-script.js';
import { bits, defineScriptLayout } from '../script-protocol.js';
import { keysBeside } from '../../store/key-layout.js';
import type { RateLimitHit } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, REDIS_TIME_LUA, algorithmArgs, algorithmsLua } from './shared.lua.js';

/** The reply of both consume scripts: all admitted, now, then per rule its decision. */
const CONSUME_REPLY = {
  head: { allowed: 'flag', now: 'number' },
  rule: { allowed: 'flag', remaining: 'number', reset: 'number', flags: bits('provisional', 'repaired') },
} as const;

/**
 * The call and reply of CONSUME_SCRIPTS.
 *
 * KEYS per rule: its state key, its block key (the time a `blockFor` penalty ends), its marker key
 * (a fixed window's count once high) and its pending key, all in one hash slot.
 * ARGV: now in ms (negative: use Redis TIME), a nonce unique to the request, then per rule: the
 * algorithm, limit, window ms, cost, burst, block ms, `force` to record the units without deciding
 * (units the fallback admitted while Redis was out), the count from which a fixed window also writes
 * its marker (0: never), and `conditional` for a `countOn` rule.
 * Reply: all admitted, now, then per rule: admitted, remaining, reset ms, and whether the rejection
 * is provisional and whether a key of the rule was repaired.
 */
export const CONSUME_LAYOUT = defineScriptLayout('consume', {
  head: { args: { now: 'number', nonce: 'string' } },
  rule: {
    keys: ['key', 'blockKey', 'markerKey', 'pendingKey'],
    args: {
      ...ALGORITHM_ARGS,
      block: 'number',
      force: 'flag',
      markFrom: 'number',
      conditional: 'flag',
    },
  },
  reply: CONSUME_REPLY,
});

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
 * The call and reply are CONSUME_LAYOUT's. Each algorithm's Lua lives in
 * `algorithms/<name>/<name>.lua.ts`, next to its TypeScript twin and its stored fields; a call runs
 * the variant holding just its hits' algorithms (`CONSUME_SCRIPTS.for(hits)`).
 */
export const CONSUME_SCRIPTS = new ScriptsByAlgorithms(
  CONSUME_LAYOUT.name,
  (algorithms) => `${algorithmsLua(algorithms)}
${CONSUME_LAYOUT.lua}
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
-- Ones older than a window hold none and are dropped. A member ends in its cost (\`pendingMember\`).
local function inFlightUnits(key, now, p, since)
  read('ZREMRANGEBYSCORE', key, '-inf', now - p.window)
  ensureTtl(key, p.window + GRACE_MS)
  local units = 0
  for _, member in ipairs(read('ZRANGEBYSCORE', key, since, '+inf') or {}) do
    units = units + (tonumber(string.match(member, ':(%d+)$')) or 0)
  end
  return units
end
local call = readHead()
local now = callTime(call.now)
local params, steps = {}, {}
local all = true
for i = 1, call.rules do
  local p = readRule(i)
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
      local inFlight = inFlightUnits(p.pendingKey, now, p, s.start or (now - p.window + 1))
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
local out = replyHead({ allowed = all, now = now })
for i = 1, call.rules do
  local p, s = params[i], steps[i]
  repaired = false
  if all then
    ALG[p.alg].commit(p.key, now, p, s, call.nonce)
    if p.conditional and not p.force then
      -- Admissions whose settle never came (a failed call, a crashed instance) hold nothing after a window.
      write('ZREMRANGEBYSCORE', p.pendingKey, '-inf', now - p.window)
      redis.call('ZADD', p.pendingKey, now, pendingMember(call.nonce, p.cost))
      redis.call('PEXPIRE', p.pendingKey, p.window + GRACE_MS)
    end
  else
    if not s.allowed and not s.blocked and not s.provisional and p.block > 0 then
      redis.call('SET', p.blockKey, fmt(now + p.block), 'PX', p.block + GRACE_MS)
      s.reset = math.max(s.reset, p.block)
    end
    -- As long as the state matters: what the check says, and two windows at least.
    ensureTtl(p.key, math.max(s.ttl or 0, 2 * p.window) + GRACE_MS)
  end
  if p.markFrom > 0 then ALG[p.alg].keepMarkerTtl(p.key, p) end
  s.repaired = s.repaired or repaired
  pushRule(out, s)
end
return out
`,
);

/**
 * The call of PLAIN_CONSUME_SCRIPT: fixed-window rules on Redis's clock without `blockFor` or
 * `countOn` (the common case), so none of the keys and args those need. KEYS per rule: its state
 * key and its marker key. ARGV: per rule its limit, window ms, cost, and the count from which the
 * marker is written. The reply is CONSUME_LAYOUT's, or the one value -1 when a key needs what only
 * CONSUME_SCRIPTS does (see below).
 */
export const PLAIN_CONSUME_LAYOUT = defineScriptLayout('consume-plain', {
  rule: { keys: ['key', 'markerKey'], args: { limit: 'number', window: 'number', cost: 'number', markFrom: 'number' } },
  reply: CONSUME_REPLY,
});

/**
 * PLAIN_CONSUME_SCRIPT's reply when CONSUME_SCRIPTS must decide instead: no count was changed (a TTL
 * given to an earlier rule's counter found without one stays).
 */
export const ASK_CONSUME_SCRIPTS = -1;

/**
 * CONSUME_SCRIPTS's decision for the calls most requests make, at the least cost to Redis: every
 * rule a fixed window on Redis's clock (`fixed-window.lua.ts`: an integer whose TTL is the window).
 * One INCRBY and one PEXPIRETIME per rule, the PEXPIREAT that starts a window, a DECRBY (or DEL) per
 * rule to take a rejected request back, and one TIME; no functions but that one, and no tables per
 * rule. Inline Lua, since Redis pays on every call for each function and argument a script has.
 *
 * A key it cannot read as a counter (a hash of an earlier version, junk) or a counter to resume from
 * its marker: it takes back what it counted and replies ASK_CONSUME_SCRIPTS, whose fixed-window Lua
 * repairs and decides. So there is one implementation of each repair; that Lua takes as a counter
 * exactly what INCRBY does.
 */
export const PLAIN_CONSUME_SCRIPT = new RedisScript(
  // Named as the operation it serves, in messages ("Redis did not answer consume").
  CONSUME_LAYOUT.name,
  `${REDIS_TIME_LUA}
-- KEYS and ARGV as PLAIN_CONSUME_LAYOUT lays them out (generated).
${PLAIN_CONSUME_LAYOUT.inline.readHead}
local keys, counts, windowEnds, costs, created, repairs = {}, {}, {}, {}, {}, {}
local function undo(upTo)
  for i = 1, upTo do
    local key = keys[i]
    if created[i] then redis.call('DEL', key) else redis.call('DECRBY', key, costs[i]) end
  end
end
-- Redis's time, read once: a new window's end is reckoned from it, and so is each reset.
local all, now = true, redisTimeMs()
for i = 1, rules do
  ${PLAIN_CONSUME_LAYOUT.inline.readRule.replace(/\n/g, '\n  ')}
  keys[i], costs[i] = key, cost
  local count = redis.pcall('INCRBY', key, cost)
  if type(count) == 'table' or count < cost then
    -- Not a counter (a hash, a fraction, junk), or a negative one.
    if type(count) == 'table' then undo(i - 1) else undo(i) end
    return { ${ASK_CONSUME_SCRIPTS} }
  end
  local ends = redis.call('PEXPIRETIME', key)
  if ends < 0 then
    created[i] = count == cost
    if created[i] and markFrom > 0 and redis.call('EXISTS', markerKey) == 1 then
      undo(i)
      return { ${ASK_CONSUME_SCRIPTS} }
    end
    -- A new window, or a counter found without a TTL (repaired: a window more at most).
    ends = now + window
    redis.call('PEXPIREAT', key, ends)
    repairs[i] = not created[i]
  end
  counts[i], windowEnds[i] = count, ends
  if count > limit then all = false end
end
local allowed = all
${PLAIN_CONSUME_LAYOUT.inline.replyHead}
for i = 1, rules do
  ${PLAIN_CONSUME_LAYOUT.inline.readRule.replace(/\n/g, '\n  ')}
  -- The caller reckons the window's start as now + reset - window. A window in its last ms by TIME
  -- still reports 1 ms left.
  local count, ends, repaired, provisional = counts[i], windowEnds[i], repairs[i], false
  local reset = math.max(1, ends - now)
  local allowed = count <= limit
  local remaining = math.max(0, limit - (allowed and count or count - cost))
  if all and markFrom > 0 and count >= markFrom then redis.call('SET', markerKey, count, 'PXAT', ends) end
  ${PLAIN_CONSUME_LAYOUT.inline.pushRule.replace(/\n/g, '\n  ')}
end
if not all then undo(rules) end
return out
`,
);

/** Whether PLAIN_CONSUME_SCRIPT replied that CONSUME_SCRIPTS must decide (it changed nothing). */
export function askedForConsumeScripts(reply: unknown): boolean {
  return Array.isArray(reply) && reply.length === 1 && reply[0] === ASK_CONSUME_SCRIPTS;
}

/**
 * Whether a call can go to PLAIN_CONSUME_SCRIPT. Not one with the lost-write marker (off by
 * default): CONSUME_SCRIPTS keeps the marker's TTL on every call (`keepMarkerTtl`).
 */
export function isPlainConsume(call: ConsumeCall): boolean {
  return (
    call.now === undefined &&
    !call.record &&
    call.markerShare === false &&
    call.hits.every((hit) => hit.algorithm === 'fixed-window' && hit.blockMs === 0 && !hit.conditional)
  );
}

export function encodePlainConsume(call: ConsumeCall): { keys: string[]; args: (string | number)[] } {
  return PLAIN_CONSUME_LAYOUT.encode(
    {},
    call.hits.map((hit) => ({
      key: hit.key,
      markerKey: keysBeside(hit.key).markerKey,
      limit: hit.limit,
      window: hit.windowMs,
      cost: hit.cost,
      markFrom: markerFrom(call.markerShare, hit),
    })),
  );
}

/** One consume call: the hits of one hash slot. */
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
  return CONSUME_LAYOUT.encode(
    { now: call.now ?? -1, nonce: call.nonce },
    call.hits.map((hit) => ({
      key: hit.key,
      ...keysBeside(hit.key),
      ...algorithmArgs(hit),
      block: hit.blockMs,
      force: call.record,
      markFrom: markerFrom(call.markerShare, hit),
      conditional: hit.conditional && !call.record,
    })),
  );
}

/** One rule's part of a consume reply. */
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
  const decoded = CONSUME_LAYOUT.decode(reply, rules);
  return {
    allowed: decoded.head.allowed,
    now: decoded.head.now,
    rules: decoded.rules.map(({ allowed, remaining, reset, provisional, repaired }) => ({
      allowed,
      remaining,
      resetMs: reset,
      provisional,
      repaired,
    })),
  };
}

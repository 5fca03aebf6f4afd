import { markerFrom } from '../failover/lost-write-marker.js';
import { ScriptsByAlgorithms } from '../script-runner.js';
import { bits } from '../script-layout.js';
import { defineScriptLayout } from '../script-protocol.js';
import { keysBeside } from '../../store/key-layout.js';
import type { RateLimitHit } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, algorithmArgs, algorithmsLua } from './shared.lua.js';

/** The reply of both consume scripts: all admitted, now, then per rule its decision. */
const CONSUME_REPLY = {
  head: { allowed: 'flag', now: 'number' },
  rule: {
    allowed: 'flag',
    remaining: 'number',
    reset: 'number',
    flags: bits('provisional', 'repaired', 'unrecorded'),
  },
} as const;

/**
 * The call and reply of CONSUME_SCRIPTS.
 *
 * KEYS per rule: its state key, its block key (the time a `blockFor` penalty ends), its marker key
 * (a fixed window's count once high) and its pending key, all in one hash slot.
 * ARGV: now in ms (negative: use Redis TIME), a nonce unique to the request, then per rule: the
 * algorithm, limit, window ms, cost, burst, block ms, `force` to record the units without deciding
 * (units the fallback admitted while Redis was out), the count from which a fixed window also writes
 * its marker (0: never), `conditional` for a `countOn` rule, `overdraft` for a `settleCost` rule
 * (the most its admission may yet be charged past its cost; -1 for other rules), and `settles` for
 * a charge that settles such an admission (its nonce; '' for none), and `within` for recorded units
 * of a fixed window (ms until the window they were admitted in ends; 0: not known).
 * Reply: all admitted, now, then per rule: admitted, remaining, reset ms, and whether the rejection
 * is provisional, whether a key of the rule was repaired, and whether recorded units were left out
 * (their window is over in Redis, which holds a later one).
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
      overdraft: 'number',
      settles: 'string',
      within: 'number',
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
 * A `settleCost` rule's admissions are in flight too until settled, each holding in its pending key
 * the most it may yet be charged past its cost (`nonce:overdraft`). A request is admitted only if the
 * budget holds it and all of those at their most; when only they stand in the way, the rejection is
 * provisional (they may settle for less). The charge that settles an admission removes its member.
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
-- Units of a rule's admissions still in flight, admitted since \`since\`: a \`countOn\` rule's that a
-- refund could give back (from a fixed window's start: one admitted in an earlier window is
-- refunded into nothing), or a \`settleCost\` rule's claims. Ones older than \`p.window\` hold none
-- and are dropped. A member ends in its units (\`pendingMember\`).
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
    elseif s.allowed and p.overdraft >= 0 then
      local claim = math.min(p.window, CLAIM_MS)
      local most = inFlightUnits(p.pendingKey, now, { window = claim }, now - claim + 1)
      if most > 0 then
        local worst = {}
        for name, value in pairs(p) do worst[name] = value end
        worst.cost = p.cost + most
        local w = algorithm.check(p.key, now, worst)
        if not w.allowed then
          -- Nothing is left for it while they run; they end by their settlements, or by their
          -- claims' end at the latest, sooner than their units would ever refill.
          s = w
          s.provisional = true
          s.remaining = 0
          s.reset = math.min(w.reset, claim)
        end
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
    elseif p.overdraft > 0 and not p.force then
      local claim = math.min(p.window, CLAIM_MS)
      write('ZREMRANGEBYSCORE', p.pendingKey, '-inf', now - claim)
      redis.call('ZADD', p.pendingKey, now, pendingMember(call.nonce, p.overdraft))
      redis.call('PEXPIRE', p.pendingKey, claim + GRACE_MS)
    end
    if p.settles ~= '' then redis.call('ZREM', p.pendingKey, pendingMember(p.settles, p.overdraft)) end
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

/** One consume call: the hits of one hash slot. */
export interface ConsumeCall {
  /** Whole ms, or undefined for Redis `TIME`. */
  now: number | undefined;
  nonce: string;
  hits: readonly RateLimitHit[];
  /** Count the units without deciding (units the fallback admitted while Redis was out). */
  record: boolean;
  /** This process's time of the call (the given `now`, else its clock): what `windowEndsAt` is on. */
  sentAt: number;
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
      overdraft: hit.overdraftBound ?? -1,
      settles: hit.settles ?? '',
      within: call.record ? msLeftOfWindow(hit, call.sentAt) : 0,
    })),
  );
}

/**
 * Ms left of the window recorded units were admitted in (`windowEndsAt`), at most a window; 0 when
 * not known. Reckoned on this process's clock and read on Redis's: a call's transit apart.
 */
function msLeftOfWindow(hit: RateLimitHit, sentAt: number): number {
  if (hit.windowEndsAt === undefined) return 0;
  return Math.min(hit.windowMs, Math.max(1, Math.ceil(hit.windowEndsAt - sentAt)));
}

/** One rule's part of a consume reply. */
export interface ConsumeRuleReply {
  allowed: boolean;
  remaining: number;
  resetMs: number;
  provisional: boolean;
  /** A key of the rule was found corrupt or without a TTL and mended. */
  repaired: boolean;
  /** Recorded units left out: Redis holds a window that started after theirs. */
  unrecorded: boolean;
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
    rules: decoded.rules.map(({ allowed, remaining, reset, provisional, repaired, unrecorded }) => ({
      allowed,
      remaining,
      resetMs: reset,
      provisional,
      repaired,
      unrecorded,
    })),
  };
}

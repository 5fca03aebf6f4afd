import type {
  RateLimitConsumption,
  RateLimitDecision,
  RateLimitHit,
  RateLimitReceipt,
} from '../../store/rate-limit-store.js';
import { RedisScript } from '../script-runner.js';

/**
 * The decision most requests ask for, at the least cost to Redis and to the app: fixed-window
 * rules on Redis's clock, without `blockFor`, `countOn` or the lost-write marker. Each counter is
 * a plain integer whose TTL is its window's absolute end, so a decision is INCRBY and PEXPIRETIME
 * (Redis 7.0 and later, which the connection checks at start: `redis-version.ts`) per rule (and
 * PEXPIREAT when a window starts), one TIME, and to take back a refused request a DECRBY per rule
 * (a DEL of a counter this call created). The reply is integers only: Redis's time, then one per
 * rule, so nothing per rule is built in Lua or parsed in the app.
 *
 * It is the full script's fixed window (`fixed-window.lua.ts`, TTL form, which explains why a
 * window is named by its stored end and one reading of TIME) for the cases that need none of its
 * repairs, and the same tests hold both to the same decisions and state. What it cannot take as a
 * counter (a hash of an earlier version, junk, a negative count) it leaves as it found it and
 * replies nil: the full script then repairs and decides, so each repair is written once.
 *
 * KEYS[i]: rule i's counter. ARGV[3i-2], ARGV[3i-1], ARGV[3i]: its limit, window ms and cost.
 * Reply: `{ now, rule 1, ..., rule n }`, where rule i is `count * (window + 1) + reset`: `count`
 * is the counter with this request's cost (before a refused request is taken back), `reset` the ms
 * to the window's end (at least 1); negated, less 1, when the counter was found without a TTL and
 * given one. nil: ask the full script (nothing was changed).
 */
export const FIXED_WINDOW_FAST_SCRIPT = new RedisScript(
  // Named as the operation it serves, in messages ("Redis did not answer consume").
  'consume',
  `
local rules = #KEYS
local counts, ends, fresh, repaired = {}, {}, {}, {}
local function undo(upTo)
  for i = 1, upTo do
    if fresh[i] then redis.call('DEL', KEYS[i]) else redis.call('DECRBY', KEYS[i], ARGV[3 * i]) end
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = true
for i = 1, rules do
  local key, limit, window, cost = KEYS[i], tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local count = redis.pcall('INCRBY', key, cost)
  if type(count) ~= 'number' then
    -- Not a counter (a hash, a fraction, junk): the full script repairs it.
    undo(i - 1)
    return nil
  end
  fresh[i] = count == cost
  if count < cost then
    -- A negative counter.
    undo(i)
    return nil
  end
  local windowEnd = redis.call('PEXPIRETIME', key)
  if windowEnd < 0 then
    -- A new window; or a counter found without a TTL, which gets one (a window more at most).
    windowEnd = now + window
    redis.call('PEXPIREAT', key, windowEnd)
    repaired[i] = not fresh[i]
  end
  counts[i], ends[i] = count, windowEnd
  if count > limit then all = false end
end
local out = { now }
for i = 1, rules do
  -- A window in its last ms by TIME still reports 1 ms left.
  local packed = counts[i] * (tonumber(ARGV[3 * i - 1]) + 1) + math.max(1, ends[i] - now)
  if packed >= 9007199254740992 then
    -- Too big for an integer the app reads exactly (a limit in the billions over a year).
    undo(rules)
    return nil
  end
  if repaired[i] then packed = -packed - 1 end
  out[i + 1] = packed
end
if not all then undo(rules) end
return out
`,
);

/**
 * Whether a hit can be decided by FIXED_WINDOW_FAST_SCRIPT (on Redis's clock, without a marker).
 * A default rule's can: fixed window, no `blockMs`, no `countOn` condition, no overdraft.
 */
export function isFastHit(hit: RateLimitHit): boolean {
  return hit.algorithm === 'fixed-window' && hit.blockMs === 0 && !hit.conditional && hit.overdraftBound === undefined;
}

/** KEYS and ARGV of a call. */
export function encodeFast(hits: readonly RateLimitHit[]): { keys: string[]; args: number[] } {
  if (hits.length === 1) {
    const [hit] = hits;
    return { keys: [hit.key], args: [hit.limit, hit.windowMs, hit.cost] };
  }
  const keys: string[] = [];
  const args: number[] = [];
  for (const hit of hits) {
    keys.push(hit.key);
    args.push(hit.limit, hit.windowMs, hit.cost);
  }
  return { keys, args };
}

/** A reply read: the decisions, and Redis's time of them. */
export interface FastConsumption extends RateLimitConsumption {
  /** Redis's time of the decision (ms). */
  now: number;
}

/**
 * The reply read, in hit order; undefined when the full script must decide (nothing was changed).
 * Receipts name each admitted unit's window by its start (`now + reset - window`), as the full
 * script's do. `repaired` is told of each counter found without a TTL. Throws on a reply of another
 * shape.
 */
export function decodeFast(
  reply: unknown,
  hits: readonly RateLimitHit[],
  repaired: (hit: RateLimitHit) => void,
): FastConsumption | undefined {
  if (reply === null) return undefined;
  if (!Array.isArray(reply) || reply.length !== hits.length + 1 || !reply.every(Number.isSafeInteger)) {
    throw new Error(`The consume script replied ${JSON.stringify(reply)} for ${hits.length} rules`);
  }
  const now = reply[0] as number;
  // Arrays made by `map`, sized once: grown by `push` from empty, each took room for 17 entries.
  const decisions = hits.map((hit, i): RateLimitDecision => {
    const value = reply[i + 1] as number;
    if (value < 0) repaired(hit);
    const packed = value < 0 ? -value - 1 : value;
    const span = hit.windowMs + 1;
    const count = Math.floor(packed / span);
    const admits = count <= hit.limit;
    const remaining = Math.max(0, hit.limit - (admits ? count : count - hit.cost));
    return { allowed: admits, limit: hit.limit, remaining, resetMs: packed - count * span };
  });
  const allowed = decisions.every(isAllowed);
  // One admission per call, so no nonce is needed (a fixed window's refund takes units, not a member).
  const receipts = allowed
    ? decisions.map((decision, i): RateLimitReceipt => ({
        admittedAt: now,
        nonce: '',
        windowStart: now + decision.resetMs - hits[i].windowMs,
      }))
    : undefined;
  return { allowed, decisions, receipts, now };
}

function isAllowed(decision: RateLimitDecision): boolean {
  return decision.allowed;
}

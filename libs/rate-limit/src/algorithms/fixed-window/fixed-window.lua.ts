import { luaStringTable } from '../../redis/script-layout-lua.js';
import { FIXED_WINDOW_FIELDS } from './fields.js';

/**
 * Fixed window in Lua: the twin of `fixed-window.ts`, in two forms by who keeps the time.
 *
 * On Redis's clock (no `clock` option: `TTL_WINDOWS`), the state key is a plain integer, the units
 * admitted, and its TTL is the window: given its absolute end (`now + window`) by the window's
 * first admission, gone when it ends. That is the least Redis can hold and do per decision (one
 * INCRBY and one PEXPIRETIME). The window's start is its end less the window. A state key found as
 * a hash (written by an earlier version, or with the `clock` option) keeps its count for what is
 * left of its window.
 *
 * On the app's clock (the `clock` option), Redis's expiry cannot time the window, so the state key
 * is a hash of `FIXED_WINDOW_FIELDS` (window start, admitted units), kept a grace beyond the window.
 *
 * From `markFrom` units on, the count also goes to the marker key, for as long as the window: a
 * counter lost in a failover resumes from it (the TypeScript twin never loses its state, so it has
 * no marker). `keepMarkerTtl` holds the marker to the rule every key keeps: never without a TTL.
 * `FIXED_WINDOW_FAST_SCRIPT` (`redis/scripts/`) is the first form again, inline and without the
 * marker, for the calls most requests make.
 */
/**
 * Lua: `ttlWindowStart(key, window)`, the start on Redis's clock of the window a counter on Redis's
 * clock holds (nil: none), for the scripts that name a window by its start (refunds, raises).
 *
 * A window is named by its start, `PEXPIRETIME - window`: the scripts give a new window its
 * absolute end (`PXAT`, `PEXPIREAT`) from the one `TIME` they read, and read that end back as
 * stored, so every reckoning of a start is exact, however far Redis's clock moves while a script
 * runs. (A second reading of the clock, `TIME + PTTL`, moves with it: Redis descheduled between
 * the two on a busy machine named one window by two starts, and refunds went astray.) Replicas
 * receive the absolute end, so a promoted replica names the same window. Two windows of a key
 * start a window apart; a reset lets the next start at once, and is announced to every instance,
 * which then forgets what it saw of the key. A key deleted behind the library's back (`FLUSHDB`)
 * starts a window told apart from the last by its later start.
 */
export const TTL_WINDOW_START_LUA = `
local function ttlWindowStart(key, window)
  local ends = redis.call('PEXPIRETIME', key)
  if ends < 0 then return nil end
  return ends - window
end`;

/**
 * Two ends of one window, one reckoned on the app's clock (recorded units' `within`) and one read on
 * Redis's, agree within this much: a call's transit, as the local fallback allows two reports.
 */
const RECORDED_WINDOW_MATCH_MS = 50;

export const FIXED_WINDOW_LUA = `
local FIXED_WINDOW = ${luaStringTable(FIXED_WINDOW_FIELDS)}
local RECORDED_WINDOW_MATCH_MS = ${RECORDED_WINDOW_MATCH_MS}
${TTL_WINDOW_START_LUA}
-- Recorded units (\`p.within\`: ms left of the window they were admitted in, 0: not known) go into
-- that window only. A window that ends later started after theirs: Redis restarted empty, or theirs
-- ended while they waited, and their requests were never in it. Counted there, they would count
-- again for a whole window of requests that came after them.
local function startedAfterTheirs(ends, now, p)
  return (p.within or 0) > 0 and ends > now + p.within + RECORDED_WINDOW_MATCH_MS
end
-- On Redis's clock: the count at a state key and its window's end, absolute (nil: no window).
local function ttlCounter(key, now, p)
  local raw = redis.pcall('GET', key)
  if type(raw) == 'table' and raw.err then
    if not string.find(raw.err, 'WRONGTYPE', 1, true) then error(raw) end
    -- A hash: the window kept on the app's clock or by an earlier version. Its count stands for
    -- what is left of its window; anything else at the key is junk.
    local st = redis.pcall('HMGET', key, FIXED_WINDOW.start, FIXED_WINDOW.count)
    redis.call('DEL', key)
    repaired = true
    if type(st) == 'table' and not st.err then
      local start, count = num(st[1]), num(st[2])
      if start and count and count >= 0 and now >= start and now < start + p.window then
        local ends = math.floor(start + p.window)
        if ends > now then
          redis.call('SET', key, math.floor(count), 'PXAT', ends)
          return math.floor(count), ends
        end
      end
    end
    return 0, nil
  end
  if not raw then return 0, nil end
  -- Only what INCRBY takes as a counter: a whole number >= 0, written plainly (no '5.0', ' 5', '05').
  local count = (raw == '0' or (#raw <= 18 and string.match(raw, '^[1-9]%d*$'))) and tonumber(raw)
  if not count then
    redis.call('DEL', key)
    repaired = true
    return 0, nil
  end
  local ends = redis.call('PEXPIRETIME', key)
  if ends < 0 then
    -- Found without a TTL: its window ends a window from now at the latest. No ban for ever.
    ends = now + p.window
    redis.call('PEXPIREAT', key, ends)
    repaired = true
  end
  return count, ends
end
local TTL_FIXED_WINDOW = {
  check = function(key, now, p)
    local count, ends = ttlCounter(key, now, p)
    local fresh = ends == nil
    if fresh and p.markFrom > 0 then
      -- The counter is missing (a failover to a replica that lacked it?) but the window's marker
      -- is not: resume from it.
      local m, mends = ttlCounter(p.markerKey, now, p)
      if mends then count = m; ends = mends end
    end
    if ends and startedAfterTheirs(ends, now, p) then
      local left = math.max(1, ends - now)
      return { allowed = true, remaining = math.max(0, p.limit - count), reset = left, ttl = left,
               ends = ends, start = ends - p.window, count = count, unrecorded = true }
    end
    -- A window Redis no longer holds, for recorded units: theirs again, ending when it did.
    ends = ends or ((p.within or 0) > 0 and now + p.within) or now + p.window
    -- A window in its last ms by TIME (read after the script began) still reports 1 ms left.
    local ttl = math.max(1, ends - now)
    local allowed = count + p.cost <= p.limit
    local used = count
    if allowed then used = count + p.cost end
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = ttl, ttl = ttl,
             ends = ends, start = ends - p.window, count = count + p.cost, fresh = fresh }
  end,
  commit = function(key, now, p, s)
    if s.unrecorded then return end
    if s.fresh then redis.call('SET', key, s.count, 'PXAT', s.ends) else redis.call('INCRBY', key, p.cost) end
    if p.markFrom > 0 and s.count >= p.markFrom then redis.call('SET', p.markerKey, s.count, 'PXAT', s.ends) end
  end,
  -- Only into the admission's window, named by its start (\`p.start\`).
  refund = function(key, at, p)
    if ttlWindowStart(key, p.window) ~= p.start then return end
    local count = tonumber(redis.pcall('GET', key))
    if not count then return end
    if count >= p.cost then redis.call('DECRBY', key, p.cost) else redis.call('SET', key, 0, 'KEEPTTL') end
  end,
}
local HASH_FIXED_WINDOW = {
  check = function(key, now, p)
    local start, count = now, 0
    local st = readFields(key, FIXED_WINDOW)
    if st.start and st.count and now < st.start + p.window then
      start = st.start; count = st.count
      if startedAfterTheirs(start + p.window, now, p) then
        return { allowed = true, remaining = math.max(0, p.limit - count), reset = start + p.window - now,
                 ttl = start + p.window - now, start = start, count = count, unrecorded = true }
      end
    elseif not (st.start and st.count) and p.markFrom > 0 then
      -- The counter is missing (a failover to a replica that lacked it?) but the window's marker
      -- is not: resume from it.
      local m = readFields(p.markerKey, FIXED_WINDOW)
      ensureTtl(p.markerKey, 2 * p.window)
      if m.start and m.count and now >= m.start and now < m.start + p.window then start = m.start; count = m.count end
    end
    if start == now and count == 0 and (p.within or 0) > 0 then
      -- A window Redis no longer holds, for recorded units: theirs again, ending when it did.
      start = now + p.within - p.window
    end
    local allowed = count + p.cost <= p.limit
    local used = count
    if allowed then used = count + p.cost end
    local reset = start + p.window - now
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = reset, ttl = reset,
             start = start, count = count + p.cost }
  end,
  commit = function(key, now, p, s)
    if s.unrecorded then return end
    redis.call('HSET', key, FIXED_WINDOW.start, fmt(s.start), FIXED_WINDOW.count, fmt(s.count))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
    if p.markFrom > 0 and s.count >= p.markFrom then
      write('HSET', p.markerKey, FIXED_WINDOW.start, fmt(s.start), FIXED_WINDOW.count, fmt(s.count))
      redis.call('PEXPIRE', p.markerKey, 2 * p.window)
    end
  end,
  refund = function(key, at, p)
    -- Never mends: a key of another form here is a window this refund is not for.
    if redis.call('TYPE', key).ok ~= 'hash' then return end
    local st = readFields(key, FIXED_WINDOW)
    if st.start and st.count and at >= st.start and at < st.start + p.window then
      redis.call('HSET', key, FIXED_WINDOW.count, fmt(math.max(0, st.count - p.cost)))
    end
  end,
}
ALG['fixed-window'] = {
  -- A marker found without a TTL (a PERSIST, a restore without TTLs) gets one, whatever the call
  -- decided: on Redis's clock its counter's end (a window without one), else two windows, as the
  -- commits give. Run for every call with a marker, after the commit: a marker is rewritten only by
  -- admissions high in a window, and read only when its counter is missing.
  keepMarkerTtl = function(key, p)
    if redis.call('PTTL', p.markerKey) ~= -1 then return end
    local ends = TTL_WINDOWS and redis.call('PEXPIRETIME', key) or -1
    if ends > 0 then
      redis.call('PEXPIREAT', p.markerKey, ends)
    else
      redis.call('PEXPIRE', p.markerKey, TTL_WINDOWS and p.window or 2 * p.window)
    end
    repaired = true
  end,
  check = function(key, now, p)
    if TTL_WINDOWS then return TTL_FIXED_WINDOW.check(key, now, p) end
    return HASH_FIXED_WINDOW.check(key, now, p)
  end,
  commit = function(key, now, p, s)
    if TTL_WINDOWS then return TTL_FIXED_WINDOW.commit(key, now, p, s) end
    return HASH_FIXED_WINDOW.commit(key, now, p, s)
  end,
  -- A refund says which form its window has: \`p.start\` is negative for one on the app's clock.
  refund = function(key, at, p)
    if p.start >= 0 then return TTL_FIXED_WINDOW.refund(key, at, p) end
    return HASH_FIXED_WINDOW.refund(key, at, p)
  end,
  -- Lost-write repair: the count of the window that started at \`p.start\` (either form), raised to
  -- at least \`p.figure\`; never a window that began since. Whether it raised.
  raise = function(key, now, p)
    local kind = redis.call('TYPE', key).ok
    local start, count
    if kind == 'string' then
      start, count = ttlWindowStart(key, p.window), tonumber(redis.call('GET', key))
    elseif kind == 'hash' then
      local st = readFields(key, FIXED_WINDOW)
      start, count = st.start, st.count
    end
    if start ~= p.start or not count or count >= p.figure then return false end
    if kind == 'string' then redis.call('SET', key, p.figure, 'KEEPTTL')
    else redis.call('HSET', key, FIXED_WINDOW.count, fmt(p.figure)) end
    return true
  end,
}
`;

import { luaStringTable } from '../../redis/script-protocol.js';
import { FIXED_WINDOW_FIELDS } from './fields.js';

/**
 * Fixed window in Lua: the twin of `fixed-window.ts`. A hash of `FIXED_WINDOW_FIELDS` (window start,
 * admitted units). From `markFrom` units on, the same two fields also go to the marker key, kept for
 * two windows: a counter lost in a failover resumes from it (the TypeScript twin never loses its
 * state, so it has no marker).
 */
export const FIXED_WINDOW_LUA = `
local FIXED_WINDOW = ${luaStringTable(FIXED_WINDOW_FIELDS)}
ALG['fixed-window'] = {
  check = function(key, now, p)
    local start, count = now, 0
    local st = readFields(key, FIXED_WINDOW)
    if st.start and st.count and now < st.start + p.window then
      start = st.start; count = st.count
    elseif not (st.start and st.count) and p.markFrom > 0 then
      -- The counter is missing (a failover to a replica that lacked it?) but the window's marker
      -- is not: resume from it.
      local m = readFields(p.markerKey, FIXED_WINDOW)
      ensureTtl(p.markerKey, 2 * p.window)
      if m.start and m.count and now >= m.start and now < m.start + p.window then start = m.start; count = m.count end
    end
    local allowed = count + p.cost <= p.limit
    local used = count
    if allowed then used = count + p.cost end
    local reset = start + p.window - now
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = reset, ttl = reset,
             start = start, count = count + p.cost }
  end,
  commit = function(key, now, p, s)
    redis.call('HSET', key, FIXED_WINDOW.start, fmt(s.start), FIXED_WINDOW.count, fmt(s.count))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
    if p.markFrom > 0 and s.count >= p.markFrom then
      write('HSET', p.markerKey, FIXED_WINDOW.start, fmt(s.start), FIXED_WINDOW.count, fmt(s.count))
      redis.call('PEXPIRE', p.markerKey, 2 * p.window)
    end
  end,
  refund = function(key, at, p)
    local st = readFields(key, FIXED_WINDOW)
    if st.start and st.count and at >= st.start and at < st.start + p.window then
      redis.call('HSET', key, FIXED_WINDOW.count, fmt(math.max(0, st.count - p.cost)))
    end
  end,
}
`;

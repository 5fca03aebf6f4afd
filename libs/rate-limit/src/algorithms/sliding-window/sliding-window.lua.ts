import { luaStringTable } from '../../redis/script-layout-lua.js';
import { SLIDING_WINDOW_FIELDS } from './fields.js';

/**
 * Sliding window counter in Lua: the twin of `sliding-window.ts`. A hash of `SLIDING_WINDOW_FIELDS`
 * (window length, window index, current and previous counts).
 */
export const SLIDING_WINDOW_LUA = `
local SLIDING_WINDOW = ${luaStringTable(SLIDING_WINDOW_FIELDS)}
-- The state at \`now\`: the current window's index, its count and the previous one's, and the
-- weighted estimate of the units in the sliding window.
local function slidingWindowState(key, now, W)
  local index = math.floor(now / W)
  local current, previous = 0, 0
  local st = readFields(key, SLIDING_WINDOW)
  if st.index and st.current and st.previous and st.window == W then
    if st.index == index or st.index == index + 1 then index = st.index; current = st.current; previous = st.previous
    elseif st.index == index - 1 then previous = st.current end
  end
  local elapsed = math.max(0, now - index * W)
  return index, current, previous, (previous * (W - elapsed)) / W + current, elapsed
end
ALG['sliding-window'] = {
  check = function(key, now, p)
    local W = p.window
    local index, current, previous, estimate, elapsed = slidingWindowState(key, now, W)
    local allowed = estimate + p.cost <= p.limit + ROUNDING_EPSILON
    local used, after = estimate, current
    if allowed then used = estimate + p.cost; after = current + p.cost end
    local reset
    if allowed then
      if after > 0 then reset = (index + 2) * W - now
      elseif previous > 0 then reset = (index + 1) * W - now
      else reset = 0 end
    elseif current + p.cost <= p.limit and previous > 0 then
      local at = W - ((p.limit - current - p.cost) * W) / previous
      reset = math.max(0, math.ceil(at - elapsed - ROUNDING_EPSILON))
    elseif p.cost > p.limit or current == 0 then
      reset = (index + 1) * W - now
    else
      local at = W - ((p.limit - p.cost) * W) / current
      reset = math.ceil((index + 1) * W + math.max(0, at) - now - ROUNDING_EPSILON)
    end
    return { allowed = allowed, remaining = math.max(0, math.floor(p.limit - used + ROUNDING_EPSILON)), reset = reset,
             ttl = (index + 2) * W - now, index = index, current = current + p.cost, previous = previous }
  end,
  commit = function(key, now, p, s)
    redis.call('HSET', key, SLIDING_WINDOW.window, fmt(p.window), SLIDING_WINDOW.index, fmt(s.index),
               SLIDING_WINDOW.current, fmt(s.current), SLIDING_WINDOW.previous, fmt(s.previous))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local index = math.floor(at / p.window)
    local st = readFields(key, SLIDING_WINDOW)
    if not (st.index and st.current and st.previous) or st.window ~= p.window then return end
    if st.index == index then redis.call('HSET', key, SLIDING_WINDOW.current, fmt(math.max(0, st.current - p.cost)))
    elseif st.index == index + 1 then
      redis.call('HSET', key, SLIDING_WINDOW.previous, fmt(math.max(0, st.previous - p.cost)))
    end
  end,
  -- Lost-write repair: the estimate at \`now\` raised to at least \`p.figure\`, the shortfall added to
  -- the current window's count. Whether it raised.
  raise = function(key, now, p)
    local W = p.window
    -- A state already two windows on (a raise read late) is newer than the figure: left alone.
    local stored = num(read('HGET', key, SLIDING_WINDOW.index))
    if stored and stored > math.floor(now / W) + 1 then return false end
    local index, current, previous, estimate = slidingWindowState(key, now, W)
    if estimate + ROUNDING_EPSILON >= p.figure then return false end
    redis.call('HSET', key, SLIDING_WINDOW.window, fmt(W), SLIDING_WINDOW.index, fmt(index),
               SLIDING_WINDOW.current, fmt(current + p.figure - estimate), SLIDING_WINDOW.previous, fmt(previous))
    redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key), (index + 2) * W - now + GRACE_MS))
    return true
  end,
}
`;

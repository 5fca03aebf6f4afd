/**
 * Sliding window counter in Lua: the twin of `algorithms/sliding-window.ts`. Hash fields: `w`
 * window length, `i` window index, `c` current count, `p` previous count.
 */
export const SLIDING_WINDOW_LUA = `
ALG['sliding-window'] = {
  check = function(key, now, p)
    local W = p.window
    local index = math.floor(now / W)
    local current, previous = 0, 0
    local st = read('HMGET', key, 'i', 'c', 'p', 'w') or {}
    local si, sc, sp, sw = num(st[1]), num(st[2]), num(st[3]), num(st[4])
    if si and sc and sp and sw == W then
      if si == index or si == index + 1 then index = si; current = sc; previous = sp
      elseif si == index - 1 then previous = sc end
    end
    local elapsed = math.max(0, now - index * W)
    local estimate = (previous * (W - elapsed)) / W + current
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
    redis.call('HSET', key, 'w', fmt(p.window), 'i', fmt(s.index), 'c', fmt(s.current), 'p', fmt(s.previous))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local index = math.floor(at / p.window)
    local st = read('HMGET', key, 'i', 'c', 'p', 'w') or {}
    local si, sc, sp, sw = num(st[1]), num(st[2]), num(st[3]), num(st[4])
    if not (si and sc and sp) or sw ~= p.window then return end
    if si == index then redis.call('HSET', key, 'c', fmt(math.max(0, sc - p.cost)))
    elseif si == index + 1 then redis.call('HSET', key, 'p', fmt(math.max(0, sp - p.cost))) end
  end,
}
`;

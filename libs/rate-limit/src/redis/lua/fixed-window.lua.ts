/**
 * Fixed window in Lua: the twin of `algorithms/fixed-window.ts`. Hash fields: `s` window start,
 * `c` admitted units.
 */
export const FIXED_WINDOW_LUA = `
ALG['fixed-window'] = {
  check = function(key, now, p)
    local start, count = now, 0
    local st = redis.call('HMGET', key, 's', 'c')
    local s0, c0 = tonumber(st[1]), tonumber(st[2])
    if s0 and c0 and now < s0 + p.window then start = s0; count = c0 end
    local allowed = count + p.cost <= p.limit
    local used = count
    if allowed then used = count + p.cost end
    local reset = start + p.window - now
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = reset, ttl = reset,
             start = start, count = count + p.cost }
  end,
  commit = function(key, now, p, s)
    redis.call('HSET', key, 's', fmt(s.start), 'c', fmt(s.count))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local st = redis.call('HMGET', key, 's', 'c')
    local start, count = tonumber(st[1]), tonumber(st[2])
    if start and count and at >= start and at < start + p.window then
      redis.call('HSET', key, 'c', fmt(math.max(0, count - p.cost)))
    end
  end,
}
`;

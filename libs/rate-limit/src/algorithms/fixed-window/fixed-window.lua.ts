/**
 * Fixed window in Lua: the twin of `algorithms/fixed-window.ts`. Hash fields: `s` window start,
 * `c` admitted units. From `markFrom` units on, the same two fields also go to the marker key, kept
 * for two windows: a counter lost in a failover resumes from it (the TypeScript twin never loses
 * its state, so it has no marker).
 */
export const FIXED_WINDOW_LUA = `
ALG['fixed-window'] = {
  check = function(key, now, p)
    local start, count = now, 0
    local st = read('HMGET', key, 's', 'c') or {}
    local s0, c0 = num(st[1]), num(st[2])
    if s0 and c0 and now < s0 + p.window then
      start = s0; count = c0
    elseif not (s0 and c0) and p.markFrom > 0 then
      -- The counter is missing (a failover to a replica that lacked it?) but the window's marker
      -- is not: resume from it.
      local m = read('HMGET', p.marker, 's', 'c') or {}
      ensureTtl(p.marker, 2 * p.window)
      local ms, mc = num(m[1]), num(m[2])
      if ms and mc and now >= ms and now < ms + p.window then start = ms; count = mc end
    end
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
    if p.markFrom > 0 and s.count >= p.markFrom then
      write('HSET', p.marker, 's', fmt(s.start), 'c', fmt(s.count))
      redis.call('PEXPIRE', p.marker, 2 * p.window)
    end
  end,
  refund = function(key, at, p)
    local st = read('HMGET', key, 's', 'c') or {}
    local start, count = num(st[1]), num(st[2])
    if start and count and at >= start and at < start + p.window then
      redis.call('HSET', key, 'c', fmt(math.max(0, count - p.cost)))
    end
  end,
}
`;

/**
 * Sliding log in Lua: the twin of `sliding-log.ts`. A sorted set, one member per admitted unit,
 * scored by its time; members are `time:nonce:unit`, unique per request (`fields.ts` says why).
 */
export const SLIDING_LOG_LUA = `
ALG['sliding-log'] = {
  check = function(key, now, p)
    -- Only units newer than now - window count; the check writes nothing.
    local from = '(' .. (now - p.window)
    local count = read('ZCOUNT', key, from, '+inf') or 0
    local allowed = count + p.cost <= p.limit
    local reset = p.window
    if not allowed then
      local mustLeave = count + p.cost - p.limit
      if mustLeave <= count then
        local entry = redis.call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', mustLeave - 1, 1)
        reset = tonumber(entry[2]) + p.window - now
      end
    end
    local used, ttl = count, p.window
    if allowed then
      used = count + p.cost
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if newest[2] then ttl = math.max(ttl, tonumber(newest[2]) + p.window - now) end
    end
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = reset, ttl = ttl }
  end,
  commit = function(key, now, p, s, nonce)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - p.window)
    local args = {}
    for n = 1, p.cost do
      args[#args + 1] = now
      args[#args + 1] = now .. ':' .. nonce .. ':' .. n
      if #args >= 200 or n == p.cost then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p, nonce)
    local members = {}
    for n = 1, p.cost do
      members[#members + 1] = at .. ':' .. nonce .. ':' .. n
      if #members >= 100 or n == p.cost then
        read('ZREM', key, unpack(members))
        members = {}
      end
    end
  end,
}
`;

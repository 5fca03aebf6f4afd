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
  -- Lost-write repair: puts back the admissions an instance made (\`p.admissions\`, \`time:nonce:cost\`
  -- separated by commas) that are still in the window, as their members: ZADD of a member present
  -- changes nothing, so instances repairing at once never add up. Whether it added any.
  raise = function(key, now, p)
    local added, newest = 0, nil
    for at, nonce, cost in string.gmatch(p.admissions, '(%d+):([^:,]+):(%d+)') do
      at = tonumber(at)
      if at > now - p.window then
        for n = 1, tonumber(cost) do added = added + write('ZADD', key, at, at .. ':' .. nonce .. ':' .. n) end
        newest = math.max(newest or at, at)
      end
    end
    if added == 0 then return false end
    redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key), newest + p.window - now + GRACE_MS))
    return true
  end,
}
`;

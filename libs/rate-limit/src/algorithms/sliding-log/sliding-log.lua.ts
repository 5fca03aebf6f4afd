/**
 * Sliding log in Lua: the twin of `sliding-log.ts`. A sorted set, one member per admission, scored
 * by its time and carrying its units: `time:nonce*units` (`fields.ts` says why), so a hit of any
 * cost writes one member, and a decision reads the admissions of one window, never its units one by one.
 */
export const SLIDING_LOG_LUA = `
-- The units of a member: \`time:nonce*units\`; one for a member of older versions (\`time:nonce:unit\`,
-- one member per unit) and for anything else found there.
local function logUnits(member) return tonumber(string.match(member, '%*(%d+)$')) or 1 end
-- The admissions in the window at \`now\`, oldest first (members and scores), and their units.
local function logWindow(key, now, p)
  local entries = read('ZRANGEBYSCORE', key, '(' .. fmt(now - p.window), '+inf', 'WITHSCORES') or {}
  local count = 0
  for i = 1, #entries, 2 do count = count + logUnits(entries[i]) end
  return entries, count
end
-- The member of an admission (time and nonce), whatever units it holds now, or nil. Scored by its
-- time, or later: a cap's slot renewed since (\`renew\`) moved on, and only forward.
local function logMember(key, at, nonce)
  for _, upTo in ipairs({ fmt(at), '+inf' }) do
    for _, member in ipairs(read('ZRANGEBYSCORE', key, fmt(at), upTo) or {}) do
      if string.match(member, '^[^:]*:([^:*]*)%*%d+$') == nonce then return member end
    end
  end
  return nil
end
local function logEntry(at, nonce, units) return at .. ':' .. nonce .. '*' .. string.format('%d', units) end
ALG['sliding-log'] = {
  check = function(key, now, p)
    -- Only units newer than now - window count; the check writes nothing.
    local entries, count = logWindow(key, now, p)
    local allowed = count + p.cost <= p.limit
    local reset = p.window
    if not allowed then
      local mustLeave = count + p.cost - p.limit
      if mustLeave <= count then
        local left = 0
        for i = 1, #entries, 2 do
          left = left + logUnits(entries[i])
          if left >= mustLeave then
            reset = tonumber(entries[i + 1]) + p.window - now
            break
          end
        end
      end
    end
    local used, ttl = count, p.window
    if allowed then
      used = count + p.cost
      if #entries > 0 then ttl = math.max(ttl, tonumber(entries[#entries]) + p.window - now) end
    end
    return { allowed = allowed, remaining = math.max(0, p.limit - used), reset = reset, ttl = ttl }
  end,
  commit = function(key, now, p, s, nonce)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now - p.window))
    if p.cost > 0 then redis.call('ZADD', key, fmt(now), logEntry(now, nonce, p.cost)) end
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  -- Takes \`p.cost\` units off the admission's member (a \`settleCost\` refund may take part of them).
  refund = function(key, at, p, nonce)
    if p.cost <= 0 then return end
    local member = logMember(key, at, nonce)
    if not member then return end
    local kept = logUnits(member) - p.cost
    redis.call('ZREM', key, member)
    if kept > 0 then redis.call('ZADD', key, fmt(at), logEntry(at, nonce, kept)) end
  end,
  -- A cap's slot kept while its request runs: its member dated \`now\` (never earlier), and the key kept
  -- a window from then. The time it holds, or -1 when it is gone (its lease ran out, or a reset).
  renew = function(key, at, p, nonce, now)
    local member = logMember(key, at, nonce)
    if not member then return -1 end
    -- GT: another instance's clock behind this one's never dates it back. Unmoved, the receipt's
    -- time stays, and a refund finds it later than that.
    local moved = redis.call('ZADD', key, 'GT', 'CH', fmt(now), member) == 1
    redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key), p.window + GRACE_MS))
    return moved and now or at
  end,
  -- Lost-write repair: puts back the admissions an instance made (\`p.admissions\`, \`time:nonce:cost\`
  -- separated by commas) that are still in the window and missing, as their members: one found
  -- (with any units) is left as it is, so instances repairing at once never add up. Whether it added any.
  raise = function(key, now, p)
    local added, newest = false, nil
    for at, nonce, cost in string.gmatch(p.admissions, '(%d+):([^:,]+):(%d+)') do
      at = tonumber(at)
      if at > now - p.window and tonumber(cost) > 0 and not logMember(key, at, nonce) then
        write('ZADD', key, fmt(at), logEntry(at, nonce, tonumber(cost)))
        added = true
        newest = math.max(newest or at, at)
      end
    end
    if not added then return false end
    redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key), newest + p.window - now + GRACE_MS))
    return true
  end,
}
`;

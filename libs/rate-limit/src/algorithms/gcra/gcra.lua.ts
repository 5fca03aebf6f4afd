/** GCRA in Lua: the twin of `gcra.ts`. A string: the theoretical arrival time (see `fields.ts`). */
export const GCRA_LUA = `
ALG['gcra'] = {
  check = function(key, now, p)
    local interval = p.window / p.limit
    local tolerance = (p.window * p.burst) / p.limit
    local tat = now
    local stored = num(read('GET', key))
    if stored then tat = math.max(stored, now) end
    local wanted = tat + p.cost * interval
    local allowAt = wanted - tolerance
    local allowed = now + ROUNDING_EPSILON >= allowAt
    local pending, due = tat - now, allowAt
    if allowed then pending = wanted - now; due = wanted end
    -- No further ahead than MAX_WAIT_MS, whatever was charged (and never back).
    local nextTat = math.max(tat, math.min(wanted, now + MAX_WAIT_MS))
    return { allowed = allowed, remaining = math.max(0, math.floor((tolerance - pending) / interval + ROUNDING_EPSILON)),
             reset = math.min(MAX_WAIT_MS, math.max(0, math.ceil(due - now - ROUNDING_EPSILON))),
             ttl = math.max(0, math.ceil(nextTat - now - ROUNDING_EPSILON)), tat = nextTat }
  end,
  commit = function(key, now, p, s)
    redis.call('SET', key, fmt(s.tat), 'PX', s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local tat = num(read('GET', key))
    if tat then redis.call('SET', key, fmt(tat - p.cost * (p.window / p.limit)), 'KEEPTTL') end
  end,
  -- Lost-write repair: \`p.figure\` units used at \`now\` put the arrival time at least that many
  -- intervals ahead; it never moves back. Whether it raised.
  raise = function(key, now, p)
    local tat = math.min(now + p.figure * (p.window / p.limit), now + MAX_WAIT_MS)
    local stored = num(read('GET', key))
    if (stored and stored + ROUNDING_EPSILON >= tat) or tat <= now then return false end
    redis.call('SET', key, fmt(tat), 'PX', math.ceil(tat - now) + GRACE_MS)
    return true
  end,
}
`;

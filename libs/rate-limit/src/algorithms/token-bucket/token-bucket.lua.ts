/**
 * Token bucket in Lua: the twin of `algorithms/token-bucket.ts`. Hash fields: `t` tokens,
 * `r` time of the last refill.
 */
export const TOKEN_BUCKET_LUA = `
ALG['token-bucket'] = {
  check = function(key, now, p)
    local rate = p.limit / p.window
    local tokens, refilledAt = p.burst, now
    local st = read('HMGET', key, 't', 'r') or {}
    local t0, r0 = num(st[1]), num(st[2])
    if t0 and r0 then
      refilledAt = math.max(now, r0)
      tokens = math.min(p.burst, t0 + math.max(0, now - r0) * rate)
    end
    local allowed = tokens + ROUNDING_EPSILON >= p.cost
    local after = tokens
    if allowed then after = tokens - p.cost end
    local full = math.max(0, math.ceil((p.burst - after) / rate - ROUNDING_EPSILON))
    local reset = full
    if not allowed then reset = math.max(0, math.ceil((p.cost - tokens) / rate - ROUNDING_EPSILON)) end
    return { allowed = allowed, remaining = math.max(0, math.floor(after + ROUNDING_EPSILON)), reset = reset,
             ttl = refilledAt - now + math.max(0, math.ceil((p.burst - (tokens - p.cost)) / rate - ROUNDING_EPSILON)),
             tokens = tokens - p.cost, refilledAt = refilledAt }
  end,
  commit = function(key, now, p, s)
    redis.call('HSET', key, 't', fmt(s.tokens), 'r', fmt(s.refilledAt))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local tokens = num(read('HGET', key, 't'))
    if tokens then redis.call('HSET', key, 't', fmt(math.min(p.burst, tokens + p.cost))) end
  end,
}
`;

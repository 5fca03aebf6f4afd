import { luaStringTable } from '../../redis/script-layout-lua.js';
import { TOKEN_BUCKET_FIELDS } from './fields.js';

/**
 * Token bucket in Lua: the twin of `token-bucket.ts`. A hash of `TOKEN_BUCKET_FIELDS` (tokens, time
 * of the last refill).
 */
export const TOKEN_BUCKET_LUA = `
local TOKEN_BUCKET = ${luaStringTable(TOKEN_BUCKET_FIELDS)}
ALG['token-bucket'] = {
  check = function(key, now, p)
    local rate = p.limit / p.window
    local tokens, refilledAt = p.burst, now
    local st = readFields(key, TOKEN_BUCKET)
    if st.tokens and st.refilledAt then
      refilledAt = math.max(now, st.refilledAt)
      tokens = math.min(p.burst, st.tokens + math.max(0, now - st.refilledAt) * rate)
    end
    local allowed = tokens + ROUNDING_EPSILON >= p.cost
    local after = tokens
    if allowed then after = tokens - p.cost end
    local function wait(units) return math.min(MAX_WAIT_MS, math.max(0, math.ceil(units / rate - ROUNDING_EPSILON))) end
    -- A debt no deeper than MAX_WAIT_MS of refill, whatever was charged.
    local kept = math.max(tokens - p.cost, p.burst - rate * MAX_WAIT_MS)
    local reset = wait(p.burst - after)
    if not allowed then reset = wait(p.cost - tokens) end
    return { allowed = allowed, remaining = math.max(0, math.floor(after + ROUNDING_EPSILON)), reset = reset,
             ttl = refilledAt - now + wait(p.burst - kept), tokens = kept, refilledAt = refilledAt }
  end,
  commit = function(key, now, p, s)
    redis.call('HSET', key, TOKEN_BUCKET.tokens, fmt(s.tokens), TOKEN_BUCKET.refilledAt, fmt(s.refilledAt))
    redis.call('PEXPIRE', key, s.ttl + GRACE_MS)
  end,
  refund = function(key, at, p)
    local tokens = num(read('HGET', key, TOKEN_BUCKET.tokens))
    if tokens then redis.call('HSET', key, TOKEN_BUCKET.tokens, fmt(math.min(p.burst, tokens + p.cost))) end
  end,
  -- Lost-write repair: at \`now\`, at most \`burst - p.figure\` tokens; a second raise to the same
  -- figure is a no-op. Whether it raised.
  raise = function(key, now, p)
    local rate = p.limit / p.window
    local st = readFields(key, TOKEN_BUCKET)
    local tokens, refilledAt = p.burst, now
    if st.tokens and st.refilledAt then
      refilledAt = math.max(now, st.refilledAt)
      tokens = math.min(p.burst, st.tokens + math.max(0, now - st.refilledAt) * rate)
    end
    local excess = tokens - (p.burst - p.figure)
    if excess <= ROUNDING_EPSILON then return false end
    local after = math.max(tokens - excess, p.burst - rate * MAX_WAIT_MS)
    redis.call('HSET', key, TOKEN_BUCKET.tokens, fmt(after), TOKEN_BUCKET.refilledAt, fmt(refilledAt))
    local full = refilledAt - now + math.min(MAX_WAIT_MS, math.ceil((p.burst - after) / rate))
    redis.call('PEXPIRE', key, math.max(redis.call('PTTL', key), full + GRACE_MS))
    return true
  end,
}
`;

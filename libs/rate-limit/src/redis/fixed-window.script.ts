import { RedisScript } from './redis-script.js';

/**
 * Fixed window, one round trip. INCRBY and the TTL are set in one atomic script, so no key can be
 * left without a TTL: a new key gets the window as its TTL, and a key found without one (left over
 * by older code that sent INCR and EXPIRE as two commands) is repaired. A hit that passes the limit
 * is taken back, so the stored value is always the number of admitted units.
 *
 * KEYS[1] counter · ARGV[1] limit · ARGV[2] window ms · ARGV[3] cost
 * Returns { allowed (1/0), admitted units, ms until the window ends }.
 */
export const FIXED_WINDOW_SCRIPT = new RedisScript(
  'fixed-window',
  `
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local count = redis.call('INCRBY', KEYS[1], cost)
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
if count > limit then
  redis.call('DECRBY', KEYS[1], cost)
  return { 0, count - cost, ttl }
end
return { 1, count, ttl }
`,
);

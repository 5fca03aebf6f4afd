import { RedisScript } from '../script-runner.js';

/**
 * Runs, once at startup, every command the library's scripts run, on scratch keys of its own, with
 * `redis.pcall`, and returns the refusals, each as the command and Redis's error (Redis 7.0 says
 * only "The user executing the script can't run this command"): an ACL that lacks one is named at startup,
 * not met by a request under attack. Redis checks the ACL for each command a script runs; the
 * script itself needs EVALSHA or EVAL and the keys (`~<prefix>:*`), without which it is refused
 * whole. The keys live a second at most, and are deleted at the end.
 *
 * KEYS[1..3]: a string, a hash and a sorted set, in one hash slot. ARGV[1]: the channel announcing
 * lowered counts, published to with the instances' hello (`[]`), which listeners ignore.
 */
export const ACCESS_PROBE_SCRIPT = new RedisScript(
  'access-probe',
  `
local refused = {}
local function try(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    local err = reply.err
    if string.find(err, 'NOPERM', 1, true) or string.find(err, 'The user executing the script', 1, true) then
      refused[#refused + 1] = string.lower(command) .. ' (' .. err .. ')'
    end
  end
  return reply
end
local s, h, z = KEYS[1], KEYS[2], KEYS[3]
try('TIME')
try('SET', s, '1', 'PX', 1000)
try('GET', s)
try('INCRBY', s, 0)
try('DECRBY', s, 0)
try('TYPE', s)
try('PTTL', s)
try('PEXPIRE', s, 1000)
try('PEXPIRETIME', s)
try('PEXPIREAT', s, 0)
try('HSET', h, 'f', '1')
try('PEXPIRE', h, 1000)
try('HGET', h, 'f')
try('HMGET', h, 'f')
try('HDEL', h, 'f')
try('ZADD', z, 0, 'm')
try('PEXPIRE', z, 1000)
try('ZCOUNT', z, 0, 1)
try('ZRANGE', z, 0, 0)
try('ZRANGEBYSCORE', z, 0, 1)
try('ZREM', z, 'm')
try('ZREMRANGEBYSCORE', z, 0, 1)
try('PUBLISH', ARGV[1], '[]')
try('DEL', s, h, z)
return refused
`,
);

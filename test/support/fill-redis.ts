import type { RedisServer } from './redis-server.js';

/**
 * Writes 1 KB values with a day's TTL (an app's cache), 100 a script, until Redis refuses one with
 * OOM or 8 MB were written. From a script: a pipeline's own buffers count against maxmemory. The
 * client stays connected (closed with the server): its going would free memory, and make room.
 */
export async function fill(server: RedisServer): Promise<'refused' | 'taken'> {
  const redis = server.client();
  const script = `for i = 1, 100 do redis.call('SET', ARGV[1] .. i, string.rep('x', 1024), 'EX', 86400) end`;
  for (let batch = 0; batch < 80; batch += 1) {
    const refused = await redis.eval(script, 0, `junk:${batch}:`).then(
      () => false,
      (error: Error) => error.message.startsWith('OOM ') || Promise.reject(error),
    );
    if (refused) return 'refused';
  }
  return 'taken';
}

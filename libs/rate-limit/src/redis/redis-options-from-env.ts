import type { RateLimitRedisOptions } from '../module/options.js';

/**
 * The Redis connection an app's environment describes, for `RateLimitModule.forRoot({ redis })`:
 * - `REDIS_CLUSTER_NODES=host:port,host:port`: a Cluster;
 * - `REDIS_SENTINELS=host:port,host:port` with `REDIS_SENTINEL_NAME` (default `mymaster`): Sentinel;
 * - `REDIS_URL=redis://…`: one server.
 * `undefined` when none is set (the embedded store). Throws on a malformed address, naming the variable.
 */
export function redisOptionsFromEnv(env: NodeJS.ProcessEnv = process.env): RateLimitRedisOptions | undefined {
  if (env.REDIS_CLUSTER_NODES) return { cluster: addresses('REDIS_CLUSTER_NODES', env.REDIS_CLUSTER_NODES) };
  if (env.REDIS_SENTINELS) {
    return {
      sentinels: addresses('REDIS_SENTINELS', env.REDIS_SENTINELS),
      name: env.REDIS_SENTINEL_NAME || 'mymaster',
    };
  }
  return env.REDIS_URL || undefined;
}

function addresses(variable: string, value: string): { host: string; port: number }[] {
  return value.split(',').map((entry) => {
    const match = /^\s*\[?([^\]\s]+?)\]?:(\d{1,5})\s*$/.exec(entry);
    const port = match ? Number(match[2]) : NaN;
    if (!match || port < 1 || port > 65_535) {
      throw new Error(`${variable}: '${entry}' is not host:port (expected e.g. 127.0.0.1:26379,127.0.0.1:26380)`);
    }
    return { host: match[1], port };
  });
}

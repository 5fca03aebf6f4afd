/**
 * The oldest Redis the scripts run on: a fixed window on Redis's clock is named by its absolute
 * end, read with PEXPIRETIME, which Redis 7.0 added.
 */
export const MINIMUM_REDIS_MAJOR = 7;

/**
 * Why a server that answered `INFO server` with `info` cannot run the library's scripts, or
 * undefined when it can or does not say its version (a proxy: its replies will tell).
 */
export function unsupportedRedis(info: string): string | undefined {
  const version = /^redis_version:(\S+)/m.exec(info)?.[1];
  if (version === undefined) return undefined;
  const major = Number.parseInt(version, 10);
  if (!(major < MINIMUM_REDIS_MAJOR)) return undefined;
  return `runs Redis ${version}; the rate-limit scripts need Redis ${MINIMUM_REDIS_MAJOR}.0 or later (PEXPIRETIME)`;
}

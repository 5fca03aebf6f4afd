#!/usr/bin/env node
/**
 * Reports (and with --repair, fixes) rate-limit keys without a TTL.
 *
 *   npm run audit:keys                       # report; exit 1 if any key has no TTL
 *   npm run audit:keys -- --repair --ttl 1d  # give each such key a TTL of one day
 *
 * Reads REDIS_URL, or REDIS_SENTINELS + REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES, and
 * RATE_LIMIT_PREFIX (default rl).
 */
import { parseArgs } from 'node:util';
import { RedisService } from '../redis/redis.service.js';
import { redisOptionsFromEnv } from '../redis/redis-options-from-env.js';
import { resolveModuleOptions } from '../module/resolve-options.js';
import { parseDuration } from '../rules/duration.js';
import { keyIdOf } from '../store/key-layout.js';

const { values } = parseArgs({
  options: { repair: { type: 'boolean', default: false }, ttl: { type: 'string', default: '1d' } },
});
const repairTtlMs = parseDuration(values.ttl);
if (repairTtlMs === undefined) throw new Error(`--ttl: '${values.ttl}' is not a duration such as 1h or 1d`);

const redis = redisOptionsFromEnv();
if (redis === undefined) throw new Error('Set REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES');
// The library's own connection: the same clients and fail-fast defaults as in an app.
const options = {
  redis,
  keyPrefix: process.env.RATE_LIMIT_PREFIX || undefined,
  storeErrors: { circuitBreaker: false as const },
};
const resolved = resolveModuleOptions(options);
const service = new RedisService(resolved);

try {
  await service.onApplicationBootstrap();
  const report = await service.auditKeys({ repairTtlMs: values.repair ? repairTtlMs : undefined });
  for (const key of report.withoutTtl) {
    const rule = report.rules[keyIdOf(key)];
    console.log(`no TTL: ${key}${rule === undefined ? '' : ` (rule ${rule})`}`);
  }
  console.log(
    `${report.scanned} keys under '${resolved.keyPrefix}:', ${report.withoutTtl.length} without a TTL` +
      (values.repair ? `, ${report.repaired} given a TTL of ${values.ttl}` : ''),
  );
  process.exitCode = report.withoutTtl.length > report.repaired ? 1 : 0;
} finally {
  await service.onApplicationShutdown();
}

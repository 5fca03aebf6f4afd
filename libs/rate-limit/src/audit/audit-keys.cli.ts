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
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { parseDuration } from '../rules/duration.js';
import { redisOptionsFromEnv } from '../redis/redis-options-from-env.js';
import { auditRateLimitKeys } from './key-audit.js';

const { values } = parseArgs({
  options: { repair: { type: 'boolean', default: false }, ttl: { type: 'string', default: '1d' } },
});
const repairTtlMs = parseDuration(values.ttl);
if (repairTtlMs === undefined) throw new Error(`--ttl: '${values.ttl}' is not a duration such as 1h or 1d`);

const connection = redisOptionsFromEnv();
if (connection === undefined) throw new Error('Set REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES');
// Fail fast rather than queue commands for a server that is not there; connect before scanning,
// so a Cluster knows its masters.
const failFast = { lazyConnect: true, enableOfflineQueue: false, connectTimeout: 5_000, maxRetriesPerRequest: 1 };
const client =
  typeof connection === 'string'
    ? new Redis(connection, failFast)
    : 'cluster' in connection
      ? new Cluster(connection.cluster, { lazyConnect: true, enableOfflineQueue: false })
      : new Redis({ ...(connection as RedisOptions), ...failFast });
const keyPrefix = process.env.RATE_LIMIT_PREFIX || 'rl';

try {
  await client.connect();
  const report = await auditRateLimitKeys(client, { keyPrefix, repairTtlMs: values.repair ? repairTtlMs : undefined });
  for (const key of report.withoutTtl) console.log(`no TTL: ${key}`);
  console.log(
    `${report.scanned} keys under '${keyPrefix}:', ${report.withoutTtl.length} without a TTL` +
      (values.repair ? `, ${report.repaired} given a TTL of ${values.ttl}` : ''),
  );
  process.exitCode = report.withoutTtl.length > report.repaired ? 1 : 0;
} finally {
  client.disconnect();
}

#!/usr/bin/env node
/**
 * Reports (and with --repair, fixes) rate-limit keys without a TTL.
 *
 *   npm run audit:keys                       # report; exit 1 if any key has no TTL
 *   npm run audit:keys -- --repair --ttl 1d  # give each such key a TTL of one day
 *
 * Reads REDIS_URL, or REDIS_SENTINELS + REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES, and
 * RATE_LIMIT_PREFIX (default rl). Installed, the command is `nest-rate-limit-audit-keys`.
 */
import 'reflect-metadata';
import { parseArgs } from 'node:util';
import { NestFactory } from '@nestjs/core';
import { RATE_LIMIT_DEFAULTS, RateLimitModule } from 'nest-rate-limit';
import { RateLimitKeyAudit, rateLimitKeyAudit } from 'nest-rate-limit/ops';
import { keyIdOf, redisOptionsFromEnv } from 'nest-rate-limit/store';

const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** `--ttl`: a whole number of ms, or a number and its unit (`12h`, `1d`), as rules take a window. */
function ttlMs(text: string): number | undefined {
  const match = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$/.exec(text);
  const ms = match ? Number(match[1]) * UNIT_MS[match[2] ?? 'ms'] : NaN;
  return Number.isSafeInteger(ms) && ms > 0 ? ms : undefined;
}

const { values } = parseArgs({
  options: { repair: { type: 'boolean', default: false }, ttl: { type: 'string', default: '1d' } },
});
const repairTtlMs = ttlMs(values.ttl);
if (repairTtlMs === undefined) throw new Error(`--ttl: '${values.ttl}' is not a duration such as 1h or 1d`);

const redis = redisOptionsFromEnv();
if (redis === undefined) throw new Error('Set REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES');
const keyPrefix = process.env.RATE_LIMIT_PREFIX || RATE_LIMIT_DEFAULTS.keyPrefix;
// The library's own connection: the same clients and fail-fast defaults as in an app.
const app = await NestFactory.createApplicationContext(
  RateLimitModule.forRoot({
    redis,
    keyPrefix,
    globalGuard: false,
    storeErrors: { circuitBreaker: false },
    extensions: [rateLimitKeyAudit()],
  }),
  { logger: ['error'] },
);

try {
  const report = await app.get(RateLimitKeyAudit).run({ repairTtlMs: values.repair ? repairTtlMs : undefined });
  for (const key of report.withoutTtl) {
    const rule = report.rules[keyIdOf(key)];
    console.log(`no TTL: ${key}${rule === undefined ? '' : ` (rule ${rule})`}`);
  }
  console.log(
    `${report.scanned} keys under '${keyPrefix}:', ${report.withoutTtl.length} without a TTL` +
      (values.repair ? `, ${report.repaired} given a TTL of ${values.ttl}` : ''),
  );
  process.exitCode = report.withoutTtl.length > report.repaired ? 1 : 0;
} finally {
  await app.close();
}

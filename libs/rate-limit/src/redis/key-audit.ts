import type { Cluster, Redis } from 'ioredis';
import { mastersOf } from './masters.js';
import { keyIdOf, liveConfigKeys, ruleKeyId } from '../store/key-layout.js';
import type { RedisService } from './redis.service.js';

export interface KeyAuditOptions {
  /** The library's key prefix; only keys under `prefix:` are read. */
  keyPrefix: string;
  /** Give each key found without a TTL this TTL. Default: report only. */
  repairTtlMs?: number;
  /** Keys asked for per SCAN call. Default 1,000. */
  scanCount?: number;
  /** Keys listed in `withoutTtl` at most (all are counted). Default: all. */
  maxListed?: number;
}

export interface KeyAuditReport {
  /** Keys under the prefix, over every master. */
  scanned: number;
  /** Keys that had no TTL: the permanent-ban symptom (at most `maxListed` of them). */
  withoutTtl: string[];
  /** How many keys had no TTL. */
  withoutTtlCount: number;
  /** How many of them were given `repairTtlMs`. */
  repaired: number;
  /**
   * The rules of the keys listed, key id to rule name (a key names its rule by `ruleKeyId`, for most
   * rules a digest), as far as the rule catalogue knows them: it is kept with `RedisConfigCentre`.
   */
  rules: Record<string, string>;
}

/**
 * Scans the library's keys on every master (one for a standalone server) and reports, and
 * optionally repairs, keys without a TTL. The scripts never leave one; older code that sent INCR
 * and EXPIRE as two commands did, and its users were banned until someone noticed.
 */
export async function auditRateLimitKeys(redis: RedisService, options: KeyAuditOptions): Promise<KeyAuditReport> {
  const { client } = redis;
  const nodes = mastersOf(client);
  const report: KeyAuditReport = { scanned: 0, withoutTtl: [], withoutTtlCount: 0, repaired: 0, rules: {} };
  const maxListed = options.maxListed ?? Infinity;
  // The live limits (`RedisConfigCentre`) are kept until deleted, by design.
  const permanent = liveConfigKeys(options.keyPrefix).hash;
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(
        cursor,
        'MATCH',
        `${options.keyPrefix}:*`,
        'COUNT',
        options.scanCount ?? 1_000,
      );
      cursor = next;
      report.scanned += keys.length;
      if (keys.length === 0) continue;
      const ttls = await Promise.all(keys.map((key) => node.pttl(key)));
      for (const [i, key] of keys.entries()) {
        if (ttls[i] !== -1 || key === permanent) continue;
        report.withoutTtlCount += 1;
        if (report.withoutTtl.length < maxListed) report.withoutTtl.push(key);
        // NX: a key that got a TTL meanwhile keeps it.
        if (options.repairTtlMs !== undefined && (await node.pexpire(key, options.repairTtlMs, 'NX')) === 1) {
          report.repaired += 1;
        }
      }
    } while (cursor !== '0');
  }
  if (report.withoutTtl.length > 0) report.rules = await ruleNames(client, options.keyPrefix, report.withoutTtl);
  return report;
}

/** The catalogued rules of these keys, by key id; none when there is no catalogue or it cannot be read. */
async function ruleNames(client: Redis | Cluster, keyPrefix: string, keys: string[]): Promise<Record<string, string>> {
  const ids = new Set(keys.map(keyIdOf));
  const names = await client.hkeys(liveConfigKeys(keyPrefix).rules).catch(() => []);
  return Object.fromEntries(names.map((name) => [ruleKeyId(name), name]).filter(([id]) => ids.has(id)));
}

import type { Cluster, Redis } from 'ioredis';
import { STORED_FIELDS } from 'nest-rate-limit/store';

/**
 * Reading and planting the state the library keeps in Redis, by the field names the package
 * documents rather than by the letters they are stored as. Keys come from the package's own
 * `rateLimitKey` / `rateLimitKeys` / `keysBeside`, or are keys a test gave the store itself.
 */

const FIXED_WINDOW = STORED_FIELDS['fixed-window'];

/** A standalone client or a Cluster (which routes each key to the master of its slot). */
type Client = Redis | Cluster;

/** A stored number as a number; a value the library would not write (`1.0`, `abc`) fails the test. */
function storedNumber(key: string, field: string, raw: string | null): number | null {
  if (raw === null) return null;
  const value = Number(raw);
  if (raw.trim() === '' || String(value) !== raw) {
    throw new Error(`${key}: ${field} holds ${JSON.stringify(raw)}, not a number as the library writes it`);
  }
  return value;
}

/**
 * The units a fixed window counted, at its state key or at its marker key (which holds the same):
 * the integer of a window on Redis's clock, or the count field of a hash (with the `clock` option,
 * or older code); null when the key or the field is missing.
 */
export async function fixedWindowCount(redis: Client, key: string): Promise<number | null> {
  const type = await redis.type(key);
  if (type === 'string') return storedNumber(key, 'count', await redis.get(key));
  return storedNumber(key, 'count', await redis.hget(key, FIXED_WINDOW.count));
}

/**
 * Writes a fixed window's state as a failover, older code or a bad restore would leave it. At a key
 * holding a window on Redis's clock (an integer timed by its TTL), only a count: the integer, its
 * TTL kept. Otherwise the hash fields given (as the `clock` option's windows and older code store
 * them), and no TTL. Values are written as given, junk included.
 */
export async function plantFixedWindow(
  redis: Client,
  key: string,
  fields: { start?: number | string; count?: number | string },
): Promise<void> {
  if ((await redis.type(key)) === 'string') {
    if (fields.start !== undefined || fields.count === undefined) {
      throw new Error(`plantFixedWindow: ${key} is a window on Redis's clock, which holds only a count`);
    }
    await redis.set(key, fields.count, 'KEEPTTL');
    return;
  }
  const pairs: (string | number)[] = [];
  if (fields.start !== undefined) pairs.push(FIXED_WINDOW.start, fields.start);
  if (fields.count !== undefined) pairs.push(FIXED_WINDOW.count, fields.count);
  if (pairs.length === 0) throw new Error('plantFixedWindow: give a start, a count or both');
  await redis.hset(key, ...pairs);
}

/** Redis's clock in ms, as the scripts read it (`TIME`). */
export async function redisNow(redis: Client): Promise<number> {
  const [seconds, micros] = await redis.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

/**
 * Whatever a key holds, by its type (a string, a hash's fields, a sorted set's members and scores),
 * to compare two servers' copies of one state; null when the key is missing.
 */
export async function storedState(redis: Client, key: string): Promise<unknown> {
  const type = await redis.type(key);
  if (type === 'none') return null;
  if (type === 'string') return redis.get(key);
  if (type === 'hash') return redis.hgetall(key);
  if (type === 'zset') return redis.zrange(key, '0', '-1', 'WITHSCORES');
  throw new Error(`storedState: ${key} is a ${type}, which the library does not write`);
}

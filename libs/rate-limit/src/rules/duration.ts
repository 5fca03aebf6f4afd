const UNIT_MS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};

const DURATION = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$/;

/**
 * The longest duration taken: 365 days. A window or a penalty becomes a key's TTL in Redis and a
 * term of the scripts' arithmetic on the clock (`now + window`, window starts, rates per ms): a
 * year is past any rate a limit means, keeps that arithmetic exact in Lua's doubles with room to
 * spare, and a value of the order of 2^53 ms (keys kept for 285,000 years) is a mistake to refuse.
 */
export const MAX_DURATION_MS = 365 * UNIT_MS.d;

/**
 * A duration: whole milliseconds, or a string such as `'500ms'`, `'1s'`, `'1.5m'`, `'1h'`, `'1d'`;
 * at most 365 days (`MAX_DURATION_MS`). Strings made only of digits are read as milliseconds, so
 * values from env files work as they are.
 */
export type Duration = number | string;

/**
 * Milliseconds for a duration, or `undefined` when it is not a positive whole number of
 * milliseconds of at most `MAX_DURATION_MS`.
 */
export function parseDuration(value: unknown): number | undefined {
  if (typeof value === 'number') {
    return Number.isSafeInteger(value) && value > 0 && value <= MAX_DURATION_MS ? value : undefined;
  }
  if (typeof value !== 'string') return undefined;
  if (/^\s*\d+\s*$/.test(value)) return parseDuration(Number(value));
  const match = DURATION.exec(value);
  if (!match) return undefined;
  return parseDuration(Number(match[1]) * UNIT_MS[match[2]]);
}

/**
 * A positive whole number (a number, or a string of digits as env files carry), else `undefined`.
 */
export function parseCount(value: unknown): number | undefined {
  const n = typeof value === 'string' && /^\s*\d+\s*$/.test(value) ? Number(value) : value;
  return typeof n === 'number' && Number.isSafeInteger(n) && n > 0 ? n : undefined;
}

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

/**
 * When something an operator sets ends (a ban, an override): a `Date`, an ISO 8601 time
 * (`'2026-12-31T23:59Z'`), a number of milliseconds since the epoch, or a duration from now with
 * its unit (`'10m'`, `'7d'`). A string of digits alone is none of them (see `parseEndTime`).
 */
export type TimeOrDuration = Date | string | number;

/** An ISO 8601 date, with a time and a zone or not: what `Date.parse` reads the same on every engine. */
const ISO_TIME = /^\d{4}-\d{2}-\d{2}(?:T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$/i;

/**
 * The time a `TimeOrDuration` ends at, in ms since the epoch, in the next `MAX_DURATION_MS` after
 * `now`; else a problem to follow the name of the caller's field (`'until' must be …`). A string of
 * digits alone (`'60'`) is refused rather than guessed: as a time it is 1970 (or 1960, as
 * `Date.parse` reads it), and as milliseconds from now it is over before anyone notices, where an
 * operator meant seconds or minutes.
 */
export function parseEndTime(value: unknown, now: number): { at: number } | { problem: string } {
  let at: number | undefined;
  if (value instanceof Date) at = value.getTime();
  else if (typeof value === 'number') at = value;
  else if (typeof value === 'string') {
    const text = value.trim();
    if (/^\d+(?:\.\d+)?$/.test(text)) {
      return {
        problem: `has no unit: give a duration with one ('${text}s', '${text}m') or a time ('2026-12-31T23:59Z')`,
      };
    }
    if (DURATION.test(text)) {
      const ms = parseDuration(text);
      at = ms === undefined ? undefined : now + ms;
    } else if (ISO_TIME.test(text)) at = Date.parse(text);
  }
  if (at === undefined || !Number.isFinite(at) || at <= now || at - now > MAX_DURATION_MS) {
    return {
      problem: `must be a time in the next ${MAX_DURATION_MS / UNIT_MS.d} days: a Date, an ISO 8601 time such as '2026-12-31T23:59Z', ms since the epoch (a number), or a duration from now with its unit ('1h', '7d')`,
    };
  }
  return { at };
}

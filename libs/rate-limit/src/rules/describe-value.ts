/**
 * A value as a message shows it: a string quoted (cut at `maxChars`, since it may be anything a
 * config centre or an app's resolver returned), an object or array by its kind, never its contents.
 */
export function describeValue(value: unknown, maxChars = 60): string {
  if (typeof value === 'string') {
    return JSON.stringify(value.length > maxChars ? `${value.slice(0, maxChars)}…` : value);
  }
  if (typeof value === 'function') return 'a function';
  if (value === null || typeof value !== 'object') return String(value);
  return Array.isArray(value) ? 'an array' : 'an object';
}

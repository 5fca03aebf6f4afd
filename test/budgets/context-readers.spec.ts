import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = join(import.meta.dirname, '../../libs/rate-limit/src');

/** The transport layer: the guard, the interceptor and what they read of each transport. */
const TRANSPORT = /^(http|transports|guard)\//;

/**
 * Files outside it that may name Nest's context, each for a reason that reads nothing of it: the
 * rule options' types (the app's functions `by`, `cost`, `skipIf`, `tiers.of` take the context), and
 * the request the limiter is given, which hands that context to those functions unread.
 */
const NAMING_ONLY = new Set(['rules/rule-options.ts', 'limiter/limited-request.ts']);

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') && !entry.name.endsWith('.spec.ts') ? [path] : [];
  });
}

describe('the execution context', () => {
  it('is read by the transport layer only: everything below it is given a LimitedRequest', () => {
    const readers = sources(SRC)
      .map((path) => relative(SRC, path))
      .filter((file) => !TRANSPORT.test(file) && !NAMING_ONLY.has(file))
      .filter((file) => /\b(ExecutionContext|ArgumentsHost)\b/.test(codeOnly(readFileSync(join(SRC, file), 'utf8'))));
    console.log(`Files outside the transport layer that name the execution context: ${readers.length}`);
    expect(readers).toEqual([]);
  });
});

/** Code without its comments and strings, which may name the context (an explanation, a message). */
function codeOnly(code: string): string {
  return code
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|`(?:[^`\\]|\\.)*`/g, "''")
    .replace(/\/\/.*$/gm, '');
}

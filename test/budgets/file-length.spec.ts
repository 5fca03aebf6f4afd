import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from '../support/demo-process.js';

/** Lines a source file of the library may have: one concept a file, read in one sitting. */
const MAX_LINES = 300;

/**
 * The files over MAX_LINES today, each with its line count as its own ceiling. A ratchet: a ceiling
 * is lowered as its file is split, and the file leaves the list once it is within MAX_LINES; no
 * file joins it. The list ends empty.
 */
const OVERSIZED_FILES: Readonly<Record<string, number>> = {};

const SRC = join(ROOT, 'libs/rate-limit/src');

/** Every non-spec `.ts` file under src/, by its path there, with its line count as `wc -l` gives it. */
function lineCounts(): Map<string, number> {
  const files = readdirSync(SRC, { recursive: true, encoding: 'utf8' })
    .filter((file) => file.endsWith('.ts') && !file.endsWith('.spec.ts'))
    .sort();
  return new Map(
    files.map((file) => {
      const text = readFileSync(join(SRC, file), 'utf8');
      return [file, text.split('\n').length - (text.endsWith('\n') ? 1 : 0)];
    }),
  );
}

describe('budget: length of the library files', () => {
  const lines = lineCounts();

  it(`every file has at most ${MAX_LINES} lines, or at most its own ceiling if it is listed`, () => {
    const over = [...lines]
      .filter(([, count]) => count > MAX_LINES)
      .map(([file, count]) => `${file}: ${count} (ceiling ${OVERSIZED_FILES[file] ?? 'none'})`);
    console.log(
      `${over.length} files over ${MAX_LINES} lines (${Object.keys(OVERSIZED_FILES).length} listed)\n  ${over.join('\n  ')}`,
    );
    const pastCeiling = [...lines]
      .filter(([file, count]) => count > (OVERSIZED_FILES[file] ?? MAX_LINES))
      .map(([file, count]) => `${file}: ${count} lines, ceiling ${OVERSIZED_FILES[file] ?? MAX_LINES}`);
    expect(pastCeiling).toEqual([]);
  });

  it(`the list of oversized files holds only files still over ${MAX_LINES} lines`, () => {
    const stale = Object.keys(OVERSIZED_FILES)
      .filter((file) => (lines.get(file) ?? 0) <= MAX_LINES)
      .map((file) =>
        lines.has(file)
          ? `${file}: ${lines.get(file)} lines now, within ${MAX_LINES}: remove it from OVERSIZED_FILES`
          : `${file}: no such file any more: remove it from OVERSIZED_FILES`,
      );
    expect(stale).toEqual([]);
  });
});

import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { ROOT } from './demo-process.js';

/**
 * Builds the package and the demo once, before any suite runs: the suites that start the demo in
 * processes of their own (and the CLI) run the build, and two suites building it at once would
 * each see the other's half-written `dist/`.
 */
export default async function buildOnce(): Promise<void> {
  await promisify(execFile)('npm', ['run', 'build'], { cwd: ROOT });
}

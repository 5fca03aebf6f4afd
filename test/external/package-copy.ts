import { execFile } from 'node:child_process';
import { cpSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const PACKAGE = join(ROOT, 'libs/rate-limit');

/**
 * Fills `dir` with the package's folder as `npm pack` sees it after the package's `prepack`, less
 * the build: package.json, LICENSE, CHANGELOG.md, and what prepack's scripts add (the README and
 * docs/, their links made to work in the package). The scripts are read from `prepack` itself, so
 * what is checked is what is published.
 */
export async function copyPackage(dir: string): Promise<void> {
  for (const file of ['package.json', 'LICENSE', 'CHANGELOG.md']) cpSync(join(PACKAGE, file), join(dir, file));
  const manifest = JSON.parse(readFileSync(join(PACKAGE, 'package.json'), 'utf8')) as { scripts: { prepack: string } };
  for (const command of manifest.scripts.prepack.split('&&').map((part) => part.trim())) {
    if (command === 'npm run build') continue;
    const script = /^node (scripts\/[\w.-]+\.mjs)$/.exec(command);
    if (!script) throw new Error(`prepack runs '${command}', which copyPackage does not know how to run on a copy`);
    await run(process.execPath, [join(PACKAGE, script[1]), dir]);
  }
}

/** The paths `npm pack` would put in the tarball, inside the package (`README.md`, `docs/options.md`, …). */
export async function packedFiles(dir: string): Promise<string[]> {
  const { stdout } = await run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts', '--loglevel=error'], {
    cwd: dir,
  });
  return (JSON.parse(stdout) as [{ files: { path: string }[] }])[0].files.map((file) => file.path);
}

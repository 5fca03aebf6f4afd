import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** The library as built at another commit, for a benchmark to run beside this checkout's. */
export interface BaselineBuild {
  /** The built main entry (`libs/rate-limit/dist/index.js`) of that commit. */
  entry: string;
  /** Removes the worktree it was built in. */
  remove(): void;
}

interface Lockfile {
  packages: Record<string, { version?: string } | undefined>;
}

function lockedVersions(lockfile: Lockfile, names: readonly string[]): Map<string, string | undefined> {
  return new Map(names.map((name) => [name, lockfile.packages[`node_modules/${name}`]?.version]));
}

/**
 * Checks out `commit` in a temporary worktree and builds its library there (`npm run build -w
 * nest-rate-limit`), against this checkout's node_modules, linked rather than installed: the app
 * that loads the older build must see the one copy of @nestjs/core and ioredis it runs on, or Nest's
 * tokens and the compared Redis client would not be the same code on both sides. So that commit's
 * lockfile must pin the library's dependencies, its peers and the compiler as this one does;
 * otherwise this throws rather than compare two different stacks.
 */
export function buildBaseline(commit: string, root = process.cwd()): BaselineBuild {
  const dir = mkdtempSync(join(tmpdir(), 'nest-rate-limit-baseline-'));
  const git = (...args: string[]) => execFileSync('git', args, { cwd: root, stdio: ['ignore', 'ignore', 'inherit'] });
  git('worktree', 'add', '--detach', dir, commit);
  const remove = () => {
    // The link first, so that removing the worktree never walks into this checkout's node_modules.
    rmSync(join(dir, 'node_modules'), { force: true });
    git('worktree', 'remove', '--force', dir);
  };
  try {
    const library = JSON.parse(readFileSync(join(dir, 'libs/rate-limit/package.json'), 'utf8')) as {
      dependencies?: Record<string, string>;
      peerDependencies?: Record<string, string>;
    };
    const names = [
      ...Object.keys(library.dependencies ?? {}),
      ...Object.keys(library.peerDependencies ?? {}),
      'typescript',
    ];
    const read = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as Lockfile;
    const theirs = lockedVersions(read(join(dir, 'package-lock.json')), names);
    const ours = lockedVersions(read(join(root, 'package-lock.json')), names);
    const differing = names.filter((name) => theirs.get(name) !== ours.get(name));
    if (differing.length > 0)
      throw new Error(
        `BASELINE=${commit} locks other versions of ${differing
          .map((name) => `${name} (${theirs.get(name)} there, ${ours.get(name)} here)`)
          .join(', ')}: its build would not run on the same stack as this one`,
      );
    symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'), 'dir');
    execFileSync('npm', ['run', 'build', '-w', 'nest-rate-limit'], {
      cwd: dir,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
  } catch (error) {
    remove();
    throw error;
  }
  return { entry: join(dir, 'libs/rate-limit/dist/index.js'), remove };
}

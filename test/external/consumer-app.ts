import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { until } from '../support/poll.js';
import { freePort } from '../support/redis-server.js';
import { PACKAGE, ROOT, copyPackage } from './package-copy.js';

/**
 * The package as a user gets it: built, packed with `npm pack`, installed from the tarball into a
 * fresh app outside the repository with plain `npm install` commands (never `--legacy-peer-deps`
 * or `--force`), compiled with plain `tsc`, booted with `node`. The app's sources are the README's
 * own code blocks (each that starts with a `// src/<file>.ts` line), so the README can never show
 * code that does not compile or does not work. Shared by the suites that build such apps.
 */

export const run = promisify(execFile);

const rootManifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
/** The versions the repository is tested with: what the consumer apps install next to the package. */
export const version = (name: string) => rootManifest.dependencies[name] ?? rootManifest.devDependencies[name];

/** The README's `// src/<file>.ts` blocks, by file name. */
export function readmeSources(): Map<string, string> {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const sources = new Map<string, string>();
  for (const [, code, file] of readme.matchAll(/```ts\n(\/\/ (src\/\S+\.ts)\n[\s\S]*?)```/g)) sources.set(file, code);
  return sources;
}

/** The packages of a README command as the test installs them: the tarball, and the versions the repository is tested with. */
export function pinned(packages: readonly string[], tarball: string, ioredis = version('ioredis')): string[] {
  return packages.map((name) => {
    if (name === 'nest-rate-limit') return tarball;
    return `${name}@${name === 'ioredis' ? ioredis : version(name)}`;
  });
}

/**
 * The package packed into a new folder, from a copy: built there (`build: 'own'`), so that suites
 * building the repository's own dist/ at the same time (the overload test builds the demo) never
 * see it half-written; or with the dist/ `test/support/build.global.ts` built once before any
 * suite of this run (`build: 'run'`), which no suite rebuilds. The folder is the caller's to remove.
 */
export async function packPackage({ build = 'own' }: { build?: 'own' | 'run' } = {}): Promise<{
  packDir: string;
  tarball: string;
}> {
  const packDir = mkdtempSync(join(tmpdir(), 'rl-pack-'));
  const copy = join(packDir, 'package');
  mkdirSync(copy);
  // What the package's prepack adds: the README and the docs it links to, their links made to work.
  await copyPackage(copy);
  if (build === 'run') {
    cpSync(join(PACKAGE, 'dist'), join(copy, 'dist'), { recursive: true });
  } else {
    const tsc = join(ROOT, 'node_modules/.bin/tsc');
    await run(tsc, ['-p', join(PACKAGE, 'tsconfig.build.json'), '--outDir', join(copy, 'dist')]);
    // The commands import the package by its name; `npm run typecheck` checks them, and here they
    // are only emitted (checked, they would be read against the repository's dist/, not this one).
    await run(tsc, ['-p', join(PACKAGE, 'tsconfig.bin.json'), '--outDir', join(copy, 'dist/bin'), '--noCheck']);
  }
  await run('npm', ['pack', '--ignore-scripts', '--pack-destination', packDir, '--loglevel=error'], { cwd: copy });
  const tarball = join(
    packDir,
    readdirSync(packDir).find((file) => file.endsWith('.tgz'))!,
  );
  return { packDir, tarball };
}

export type Flavour = 'esm' | 'commonjs';

/** `npm install` arguments, one list per command, run one after another as a user would. */
export type Installs = readonly (readonly string[])[];

/**
 * A fresh app in its own folder, shaped like the Nest CLI's starter (what `nest new` depends on),
 * in ESM or CommonJS, then the given `npm install` commands. Its sources are the README's blocks
 * (`only`: those of these files) and `extra` files of the suite's own (by path, as `src/x.ts`).
 */
export async function createApp(
  flavour: Flavour,
  installs: Installs,
  dirs: string[],
  {
    only,
    skipLibCheck = false,
    extra = {},
  }: { only?: readonly string[]; skipLibCheck?: boolean; extra?: Readonly<Record<string, string>> } = {},
): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), `rl-consumer-${flavour}-`));
  // Removed after the suite even when an install below fails.
  dirs.push(dir);
  const manifest = {
    name: `consumer-${flavour}`,
    private: true,
    ...(flavour === 'esm' ? { type: 'module' } : {}),
    dependencies: Object.fromEntries(
      ['@nestjs/common', '@nestjs/core', '@nestjs/platform-express', 'reflect-metadata', 'rxjs'].map((name) => [
        name,
        version(name),
      ]),
    ),
    devDependencies: { typescript: version('typescript'), '@types/node': version('@types/node') },
  };
  writeFileSync(join(dir, 'package.json'), JSON.stringify(manifest, null, 2));
  writeFileSync(
    join(dir, 'tsconfig.json'),
    JSON.stringify(
      {
        compilerOptions: {
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2023',
          types: ['node'],
          experimentalDecorators: true,
          emitDecoratorMetadata: true,
          strict: true,
          skipLibCheck,
          outDir: 'dist',
          rootDir: 'src',
        },
        include: ['src'],
      },
      null,
      2,
    ),
  );
  mkdirSync(join(dir, 'src'));
  for (const [file, code] of readmeSources()) if (!only || only.includes(file)) writeFileSync(join(dir, file), code);
  for (const [file, code] of Object.entries(extra)) writeFileSync(join(dir, file), code);
  for (const packages of installs) {
    // From npm's cache when it has them (CI's `npm ci` filled it), else from the registry. A failed
    // command (an ERESOLVE) rejects with npm's output.
    await run('npm', ['install', ...packages, '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], {
      cwd: dir,
    });
  }
  return dir;
}

/** `tsc` in the app, failing with its output. It emits even then: what a type error leaves can still run. */
export async function compile(dir: string): Promise<void> {
  await run(join(dir, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: dir }).catch(
    (error: { stdout?: string }) => {
      throw new Error(`tsc failed:\n${error.stdout}`);
    },
  );
}

/** The version of a package the app has installed. */
export function installed(dir: string, name: string): string {
  return (JSON.parse(readFileSync(join(dir, 'node_modules', name, 'package.json'), 'utf8')) as { version: string })
    .version;
}

/** A booted app: its URL, its process, and what it wrote so far (for the failure messages). */
export interface BootedApp {
  url: string;
  process: ChildProcess;
  output: () => string;
}

/** `node dist/main.js` (or another entry) on a free port; resolves once it answers. */
export async function boot(dir: string, env: Record<string, string>, entry = 'dist/main.js'): Promise<BootedApp> {
  const port = await freePort();
  const child = spawn(process.execPath, [entry], {
    cwd: dir,
    env: { ...process.env, ...env, PORT: String(port) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  await new Promise<void>((resolve, reject) => {
    const onData = () => {
      if (output.includes('Nest application successfully started')) resolve();
    };
    child.stdout!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`the app exited with ${code}:\n${output}`)));
  });
  // The start-up line can come just before the socket accepts: wait until it does (bounded).
  await until(() => accepts(port), {
    timeoutMs: 2_000,
    intervalMs: 20,
    what: `the app accepting connections on ${port}`,
  }).catch((error: Error) => {
    throw new Error(`${error.message}:\n${output}`);
  });
  return { url: `http://127.0.0.1:${port}`, process: child, output: () => output };
}

/** `node dist/main.js` expected to stop by itself: its exit code and output. */
export async function exited(
  dir: string,
  env: Record<string, string>,
): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, ['dist/main.js'], {
    cwd: dir,
    env: { ...process.env, ...env, PORT: String(await freePort()) },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  clearTimeout(timer);
  return { code, output };
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

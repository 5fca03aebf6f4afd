import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, freePort, startRedisServer } from '../support/redis-server.js';

/**
 * The package as a user gets it: built, packed with `npm pack`, installed from the tarball into a
 * fresh app outside the repository, compiled with plain `tsc`, booted with `node`. The app's sources
 * are the README's own code blocks (each that starts with a `// src/<file>.ts` line), so the README
 * can never show code that does not compile or does not work.
 */

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PACKAGE = join(ROOT, 'libs/rate-limit');
const run = promisify(execFile);
const rootManifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
/** The versions the repository is tested with: what the consumer apps install next to the package. */
const version = (name: string) => rootManifest.dependencies[name] ?? rootManifest.devDependencies[name];

/** The README's `// src/<file>.ts` blocks, by file name. */
function readmeSources(): Map<string, string> {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const sources = new Map<string, string>();
  for (const [, code, file] of readme.matchAll(/```ts\n(\/\/ (src\/\S+\.ts)\n[\s\S]*?)```/g)) sources.set(file, code);
  return sources;
}

type Flavour = 'esm' | 'commonjs';

/** A fresh app in its own folder, shaped like the Nest CLI's starter, in ESM or CommonJS. */
async function createApp(flavour: Flavour, tarball: string): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), `rl-consumer-${flavour}-`));
  const manifest = {
    name: `consumer-${flavour}`,
    private: true,
    ...(flavour === 'esm' ? { type: 'module' } : {}),
    dependencies: Object.fromEntries([
      ['nest-rate-limit', `file:${tarball}`],
      ...[
        '@nestjs/common',
        '@nestjs/core',
        '@nestjs/config',
        '@nestjs/platform-express',
        'ioredis',
        'reflect-metadata',
        'rxjs',
      ].map((name) => [name, version(name)]),
    ]),
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
          skipLibCheck: false,
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
  const sources = readmeSources();
  // The app boots from these two; the README's other blocks are compiled with them.
  expect([...sources.keys()]).toEqual(expect.arrayContaining(['src/app.module.ts', 'src/main.ts']));
  for (const [file, code] of sources) writeFileSync(join(dir, file), code);
  // From npm's cache when it has them (CI's `npm ci` filled it), else from the registry.
  await run('npm', ['install', '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: dir });
  return dir;
}

/** `node dist/main.js` on a free port; resolves once it answers. */
async function boot(dir: string, env: Record<string, string>): Promise<{ url: string; process: ChildProcess }> {
  const port = await freePort();
  const child = spawn(process.execPath, ['dist/main.js'], {
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
  return { url: `http://127.0.0.1:${port}`, process: child };
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

describe('the packed package in fresh apps outside the repository', () => {
  let tarball: string;
  let packDir: string;
  let redis: RedisServer;
  const dirs: string[] = [];
  const processes: ChildProcess[] = [];

  beforeAll(async () => {
    // Built and packed from a copy, so that suites building the repository's own dist/ at the same
    // time (the overload test builds the demo) never see it half-written.
    packDir = mkdtempSync(join(tmpdir(), 'rl-pack-'));
    const copy = join(packDir, 'package');
    mkdirSync(copy);
    for (const file of ['package.json', 'LICENSE', 'CHANGELOG.md']) cpSync(join(PACKAGE, file), join(copy, file));
    // What the package's prepack adds: the README and the docs it links to.
    await run(process.execPath, [join(PACKAGE, 'scripts/bundle-docs.mjs'), copy]);
    const tsc = join(ROOT, 'node_modules/.bin/tsc');
    await run(tsc, ['-p', join(PACKAGE, 'tsconfig.build.json'), '--outDir', join(copy, 'dist')]);
    await run('npm', ['pack', '--ignore-scripts', '--pack-destination', packDir, '--loglevel=error'], { cwd: copy });
    tarball = join(
      packDir,
      readdirSync(packDir).find((file) => file.endsWith('.tgz'))!,
    );
    redis = await startRedisServer();
  }, 120_000);

  afterAll(async () => {
    for (const child of processes) child.kill('SIGKILL');
    await redis?.stop();
    for (const dir of [...dirs, packDir]) if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('ships compiled JavaScript, declarations, the audit command, LICENSE and CHANGELOG, and no sources or specs', async () => {
    const { stdout } = await run('tar', ['-tzf', tarball]);
    const files = stdout.trim().split('\n');
    expect(files).toContain('package/dist/index.js');
    expect(files).toContain('package/dist/index.d.ts');
    expect(files).toContain('package/dist/audit/audit-keys.cli.js');
    expect(files).toContain('package/LICENSE');
    expect(files).toContain('package/CHANGELOG.md');
    expect(files).toContain('package/README.md');
    expect(files).toContain('package/docs/options.md');
    expect(files.filter((file) => file.startsWith('package/src/') || file.includes('.spec.'))).toEqual([]);
  });

  it.each<[Flavour, 'Redis' | 'embedded']>([
    ['esm', 'Redis'],
    ['commonjs', 'embedded'],
  ])(
    '%s app, %s store: the README code compiles with tsc, boots, and limits: 200, 200, 200, 429 with Retry-After',
    { timeout: 180_000 },
    async (flavour, store) => {
      const dir = await createApp(flavour, tarball);
      dirs.push(dir);
      await run(join(dir, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: dir });
      const app = await boot(dir, store === 'Redis' ? { REDIS_URL: redis.url } : {});
      processes.push(app.process);
      const responses = [];
      for (let i = 0; i < 4; i += 1) responses.push(await fetch(`${app.url}/hello`));
      expect(responses.map((response) => response.status)).toEqual([200, 200, 200, 429]);
      expect(Number(responses[3].headers.get('retry-after'))).toBeGreaterThan(0);
      expect(await responses[0].json()).toEqual({ hello: 'world' });
      if (store === 'Redis') {
        // The package's command, as installed: it finds the app's keys, all with a TTL.
        const bin = join(dir, 'node_modules/.bin/nest-rate-limit-audit-keys');
        const { stdout } = await run(bin, [], { env: { ...process.env, REDIS_URL: redis.url } });
        expect(stdout).toMatch(/^[1-9]\d* keys under 'rl:', 0 without a TTL$/m);
      }
      app.process.kill('SIGTERM');
    },
  );
});

import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, freePort, startRedisServer } from '../support/redis-server.js';
import { PACKAGE, ROOT, copyPackage } from './package-copy.js';

/**
 * The package as a user gets it: built, packed with `npm pack`, installed from the tarball into a
 * fresh app outside the repository with plain `npm install` commands (never `--legacy-peer-deps`
 * or `--force`), compiled with plain `tsc`, booted with `node`. The app's sources are the README's
 * own code blocks (each that starts with a `// src/<file>.ts` line), so the README can never show
 * code that does not compile or does not work.
 */

const run = promisify(execFile);
const rootManifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};
/** The versions the repository is tested with: what the consumer apps install next to the package. */
const version = (name: string) => rootManifest.dependencies[name] ?? rootManifest.devDependencies[name];
/** The oldest ioredis the package's peer range admits, for the app on ioredis 5. */
const IOREDIS_5 = '5.4.0';

/** The README's `// src/<file>.ts` blocks, by file name. */
function readmeSources(): Map<string, string> {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const sources = new Map<string, string>();
  for (const [, code, file] of readme.matchAll(/```ts\n(\/\/ (src\/\S+\.ts)\n[\s\S]*?)```/g)) sources.set(file, code);
  return sources;
}

type Flavour = 'esm' | 'commonjs';

/** `npm install` arguments, one list per command, run one after another as a user would. */
type Installs = readonly (readonly string[])[];

/** The README's `npm install` commands (in its Install section), each as the packages it names. */
function readmeInstalls(): string[][] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('\n## Install\n');
  const section = readme.slice(start, readme.indexOf('\n## ', start + 1));
  return [...section.matchAll(/```bash\n([\s\S]*?)```/g)].flatMap(([, code]) =>
    code
      .split('\n')
      .filter((line) => line.startsWith('npm install '))
      .map((line) => line.slice('npm install '.length).trim().split(/\s+/)),
  );
}

/** The packages of a README command as the test installs them: the tarball, and the versions the repository is tested with. */
function pinned(packages: readonly string[], tarball: string, ioredis = version('ioredis')): string[] {
  return packages.map((name) => {
    if (name === 'nest-rate-limit') return tarball;
    return `${name}@${name === 'ioredis' ? ioredis : version(name)}`;
  });
}

/** The README's blocks an app on the package alone compiles: they import nothing but the package's front door. */
const CORE_SOURCES = ['src/app.module.ts', 'src/main.ts'];

/**
 * A fresh app in its own folder, shaped like the Nest CLI's starter (what `nest new` depends on),
 * in ESM or CommonJS, then the given `npm install` commands. Its sources are the README's blocks
 * (`only`: those of these files), and a `health-main.ts` that boots the README's health module.
 */
async function createApp(
  flavour: Flavour,
  installs: Installs,
  dirs: string[],
  { only, skipLibCheck = false }: { only?: readonly string[]; skipLibCheck?: boolean } = {},
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
  const sources = readmeSources();
  // The app boots from these; the README's other blocks are compiled with them.
  expect([...sources.keys()]).toEqual(
    expect.arrayContaining(['src/app.module.ts', 'src/main.ts', 'src/health.module.ts']),
  );
  for (const [file, code] of sources) if (!only || only.includes(file)) writeFileSync(join(dir, file), code);
  // The README's health module, booted as main.ts boots the app module.
  if (!only)
    writeFileSync(
      join(dir, 'src/health-main.ts'),
      sources
        .get('src/main.ts')!
        .replace(
          "import { AppModule } from './app.module.js';",
          "import { HealthAppModule } from './health.module.js';",
        )
        .replace('NestFactory.create(AppModule)', 'NestFactory.create(HealthAppModule)'),
    );
  for (const packages of installs) {
    // From npm's cache when it has them (CI's `npm ci` filled it), else from the registry. A failed
    // command (an ERESOLVE) rejects with npm's output.
    await run('npm', ['install', ...packages, '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], {
      cwd: dir,
    });
  }
  return dir;
}

/** `tsc` in the app, failing with its output. */
async function compile(dir: string): Promise<void> {
  await run(join(dir, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: dir }).catch(
    (error: { stdout?: string }) => {
      throw new Error(`tsc failed:\n${error.stdout}`);
    },
  );
}

/** The version of a package the app has installed. */
function installed(dir: string, name: string): string {
  return (JSON.parse(readFileSync(join(dir, 'node_modules', name, 'package.json'), 'utf8')) as { version: string })
    .version;
}

/** `node dist/main.js` (or another entry) on a free port; resolves once it answers. */
async function boot(
  dir: string,
  env: Record<string, string>,
  entry = 'dist/main.js',
): Promise<{ url: string; process: ChildProcess }> {
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
  return { url: `http://127.0.0.1:${port}`, process: child };
}

/** `node dist/main.js` expected to stop by itself: its exit code and output. */
async function exited(dir: string, env: Record<string, string>): Promise<{ code: number | null; output: string }> {
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
    // What the package's prepack adds: the README and the docs it links to, their links made to work.
    await copyPackage(copy);
    const tsc = join(ROOT, 'node_modules/.bin/tsc');
    await run(tsc, ['-p', join(PACKAGE, 'tsconfig.build.json'), '--outDir', join(copy, 'dist')]);
    // The commands import the package by its name; `npm run typecheck` checks them, and here they are
    // only emitted (checked, they would be read against the repository's dist/, not this one).
    await run(tsc, ['-p', join(PACKAGE, 'tsconfig.bin.json'), '--outDir', join(copy, 'dist/bin'), '--noCheck']);
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
    // Four apps' node_modules to remove.
  }, 120_000);

  it('ships compiled JavaScript, declarations, the commands, LICENSE and CHANGELOG, and no sources or specs', async () => {
    const { stdout } = await run('tar', ['-tzf', tarball]);
    const files = stdout.trim().split('\n');
    for (const entry of ['index', 'live/index', 'ops/index', 'store/index']) {
      expect(files).toContain(`package/dist/${entry}.js`);
      expect(files).toContain(`package/dist/${entry}.d.ts`);
    }
    expect(files).toContain('package/dist/bin/audit-keys.js');
    expect(files).toContain('package/dist/bin/limits.js');
    expect(files).toContain('package/LICENSE');
    expect(files).toContain('package/CHANGELOG.md');
    expect(files).toContain('package/README.md');
    expect(files).toContain('package/docs/options.md');
    expect(files.filter((file) => file.startsWith('package/src/') || file.includes('.spec.'))).toEqual([]);
  });

  it('the README’s Install section: the package with the peers a `nest new` app lacks, then terminus and prom-client', () => {
    expect(readmeInstalls()).toEqual([
      ['nest-rate-limit', '@nestjs/config', 'ioredis'],
      ['@nestjs/terminus', 'prom-client'],
    ]);
  });

  it.each<[string, Flavour, 'Redis' | 'embedded', (tarball: string) => Installs]>([
    [
      'the README’s commands in order',
      'esm',
      'Redis',
      (tarball) => readmeInstalls().map((packages) => pinned(packages, tarball)),
    ],
    [
      'the package alone, then its optional peers, then terminus and prom-client',
      'commonjs',
      'embedded',
      (tarball) => [
        [tarball],
        pinned(
          readmeInstalls()[0].filter((name) => name !== 'nest-rate-limit'),
          tarball,
        ),
        pinned(readmeInstalls()[1], tarball),
      ],
    ],
    [
      'the README’s commands the other way round, on ioredis 5.4',
      'esm',
      'Redis',
      (tarball) =>
        readmeInstalls()
          .reverse()
          .map((packages) => pinned(packages, tarball, IOREDIS_5)),
    ],
  ])(
    '%s: a %s app installs with plain npm install; on the %s store the README code compiles with tsc, boots, limits (200, 200, 200, 429 with Retry-After) and reports its health and metrics',
    { timeout: 240_000 },
    async (_, flavour, store, installs) => {
      const dir = await createApp(flavour, installs(tarball), dirs);
      if (installs(tarball).some((packages) => packages.includes(`ioredis@${IOREDIS_5}`))) {
        expect(installed(dir, 'ioredis')).toBe(IOREDIS_5);
      }
      await compile(dir);
      const env: Record<string, string> = store === 'Redis' ? { REDIS_URL: redis.url } : {};
      const app = await boot(dir, env);
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

      const health = await boot(dir, env, 'dist/health-main.js');
      processes.push(health.process);
      const report = await fetch(`${health.url}/health`);
      expect(report.status).toBe(200);
      expect(await report.json()).toMatchObject({ status: 'ok', info: { rate_limit: { status: 'up' } } });
      const metrics = await fetch(`${health.url}/metrics`);
      expect(metrics.headers.get('content-type')).toMatch(/^text\/plain/);
      expect(await metrics.text()).toContain('rate_limit_decisions_total');
      health.process.kill('SIGTERM');
    },
  );

  it(
    'the package alone, without @nestjs/config and ioredis: on the embedded store the README’s app compiles, boots and limits; given `redis`, it stops at its start naming the option and what to install',
    { timeout: 240_000 },
    async () => {
      const dir = await createApp('esm', [[tarball]], dirs, {
        only: CORE_SOURCES,
        // As `nest new`'s tsconfig has it: the declarations of the `redis` option name ioredis's
        // types, which an app that leaves ioredis out never uses.
        skipLibCheck: true,
      });
      for (const peer of ['@nestjs/config', 'ioredis'])
        expect(existsSync(join(dir, 'node_modules', peer)), peer).toBe(false);
      await compile(dir);
      const app = await boot(dir, {});
      processes.push(app.process);
      const statuses = [];
      for (let i = 0; i < 4; i += 1) statuses.push((await fetch(`${app.url}/hello`)).status);
      expect(statuses).toEqual([200, 200, 200, 429]);
      app.process.kill('SIGTERM');

      const { code, output } = await exited(dir, { REDIS_URL: redis.url });
      expect(code).not.toBe(0);
      expect(output).toContain("RateLimitModule options: 'redis' needs the package ioredis: npm install ioredis");
    },
  );
});

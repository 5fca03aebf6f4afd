import type { ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import {
  type Flavour,
  type Installs,
  boot,
  compile,
  createApp,
  exited,
  installed,
  packPackage,
  pinned,
  readmeSources,
  run,
} from './consumer-app.js';
import { ROOT } from './package-copy.js';

/**
 * The package as a user gets it (see consumer-app.ts), in fresh ESM and CommonJS apps: installed
 * with the README's own commands, compiled from the README's own blocks, booted, limiting.
 */

/** The oldest ioredis the package's peer range admits, for the app on ioredis 5. */
const IOREDIS_5 = '5.4.0';

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

/** The README's blocks an app on the package alone compiles: they import nothing but the package's front door. */
const CORE_SOURCES = ['src/app.module.ts', 'src/main.ts'];

/** The README's health module, booted as the README's main.ts boots the app module. */
function healthMain(): Record<string, string> {
  const sources = readmeSources();
  // The app boots from these; the README's other blocks are compiled with them.
  expect([...sources.keys()]).toEqual(
    expect.arrayContaining(['src/app.module.ts', 'src/main.ts', 'src/health.module.ts']),
  );
  return {
    'src/health-main.ts': sources
      .get('src/main.ts')!
      .replace("import { AppModule } from './app.module.js';", "import { HealthAppModule } from './health.module.js';")
      .replace('NestFactory.create(AppModule)', 'NestFactory.create(HealthAppModule)'),
  };
}

describe('the packed package in fresh apps outside the repository', () => {
  let tarball: string;
  let packDir: string;
  let redis: RedisServer;
  const dirs: string[] = [];
  const processes: ChildProcess[] = [];

  beforeAll(async () => {
    ({ packDir, tarball } = await packPackage());
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
      const dir = await createApp(flavour, installs(tarball), dirs, { extra: healthMain() });
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

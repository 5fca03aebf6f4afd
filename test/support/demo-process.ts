import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { freePort } from './redis-server.js';

/** The repository's root, where the built demo is (`dist/`, built once per run by `build.global.ts`). */
export const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface DemoProcess {
  readonly url: string;
  /** Everything it wrote to stdout and stderr so far. */
  output(): string;
  /** SIGTERM, then waits for the exit; SIGKILL if it has not exited 10 s later. */
  stop(): Promise<void>;
  /** SIGKILL at once, as a crash: nothing of the app runs again. Resolves once it has exited. */
  kill(): Promise<void>;
}

/**
 * The built demo in a process of its own, on a free loopback port, with `env` over this process's
 * environment; resolves once it listens. It goes into `started` at once, so that it is stopped
 * even if it never listens.
 */
export async function startDemoProcess(
  env: Record<string, string>,
  started: DemoProcess[],
  nodeArgs: readonly string[] = [],
): Promise<DemoProcess> {
  const port = await freePort();
  const child: ChildProcess = spawn(process.execPath, [...nodeArgs, 'dist/apps/demo/src/main.js'], {
    cwd: ROOT,
    env: { ...process.env, ...env, PORT: String(port), NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const demo: DemoProcess = {
    url: `http://127.0.0.1:${port}`,
    output: () => output,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      process.kill(child.pid!, 'SIGTERM');
      const kill = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(kill);
    },
    async kill() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGKILL');
      await exited;
    },
  };
  started.push(demo);
  await new Promise<void>((resolve, reject) => {
    const onData = () => {
      if (output.includes('Demo listening')) {
        child.stdout!.off('data', onData);
        resolve();
      }
    };
    child.stdout!.on('data', onData);
    void exited.then(() => reject(new Error(`demo exited with ${child.exitCode} before listening:\n${output}`)));
  });
  return demo;
}

import { type ChildProcess, spawn } from 'node:child_process';
import { freePort } from '../../test/support/redis-server.js';

/**
 * The built demo (`npm run build`) in a process of its own, on a free loopback port, with `/ping`'s
 * limit far above any load so every request pays the limiter's full path.
 */
export async function startDemo(env: Record<string, string>): Promise<{ url: string; stop(): Promise<void> }> {
  const port = await freePort();
  const child: ChildProcess = spawn(process.execPath, ['dist/apps/demo/src/main.js'], {
    env: { ...process.env, ...env, PORT: String(port), RATE_LIMIT_DEMO_PING_COUNT: '1000000000' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    let output = '';
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Demo listening')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`demo exited with ${code} (run npm run build first):\n${output}`)));
  });
  // Keep draining its log so the pipe never fills.
  child.stdout!.resume();
  return {
    url: `http://127.0.0.1:${port}`,
    stop: () =>
      new Promise<void>((resolve) => {
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

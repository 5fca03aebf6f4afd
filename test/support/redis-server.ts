import { type ChildProcess, spawn } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { Redis } from 'ioredis';

/** A redis-server process this test file started, on a loopback port of its own. */
export interface RedisServer {
  readonly port: number;
  readonly url: string;
  readonly pid: number;
  /** A new client; closed by `stop()`. */
  client(): Redis;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/** Starts `redis-server` (from PATH or `REDIS_SERVER_BIN`) on a free loopback port, with no persistence. */
export async function startRedisServer(extraArgs: readonly string[] = []): Promise<RedisServer> {
  const binary = findRedisServer();
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await launch(binary, await freePort(), extraArgs);
    } catch (error) {
      // Another process may take the port between our probe and redis-server's bind.
      if (attempt >= 3 || !String(error).includes('Address already in use')) throw error;
    }
  }
}

function findRedisServer(): string {
  const explicit = process.env.REDIS_SERVER_BIN;
  const candidates = explicit
    ? [explicit]
    : (process.env.PATH ?? '')
        .split(delimiter)
        .filter(Boolean)
        .map((dir) => join(dir, 'redis-server'));
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // try the next one
    }
  }
  throw new Error(
    explicit
      ? `REDIS_SERVER_BIN=${explicit} is not an executable file`
      : 'redis-server is not on PATH. Install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or set REDIS_SERVER_BIN to its path.',
  );
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

async function launch(binary: string, port: number, extraArgs: readonly string[]): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), 'rl-redis-'));
  const child = spawn(
    binary,
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      '--logfile',
      '',
      ...extraArgs,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  running.add(child);
  let output = '';
  await new Promise<void>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes('Ready to accept connections')) {
        child.stdout!.off('data', onData);
        resolve();
      }
    };
    child.stdout!.on('data', onData);
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`redis-server on port ${port} exited with ${code}:\n${output}`)));
  }).catch((error: unknown) => {
    running.delete(child);
    rmSync(dir, { recursive: true, force: true });
    throw error;
  });
  // Keep draining output so the pipe never fills and blocks the server.
  child.stdout!.resume();
  child.stderr!.resume();

  const clients: Redis[] = [];
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    pid: child.pid!,
    client() {
      const client = new Redis({ host: '127.0.0.1', port, lazyConnect: false, maxRetriesPerRequest: 1 });
      clients.push(client);
      return client;
    },
    async stop() {
      for (const client of clients) client.disconnect();
      if (child.exitCode === null && child.signalCode === null) {
        process.kill(child.pid!, 'SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }
      running.delete(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

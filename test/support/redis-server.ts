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

/** A TCP port free on 127.0.0.1 right now. */
export function freePort(): Promise<number> {
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

/** A Redis Cluster of masters this test file started: each a redis-server on its own port. */
export interface RedisCluster {
  readonly nodes: readonly RedisServer[];
  /** `{ host, port }` of every node, for `new Cluster(...)` or `redis: { cluster }`. */
  readonly startupNodes: { host: string; port: number }[];
  stop(): Promise<void>;
}

/**
 * Starts `masters` cluster-enabled redis-servers, gives each an even share of the 16384 slots,
 * joins them, and resolves once every node reports `cluster_state:ok`.
 */
export async function startRedisCluster(masters = 3): Promise<RedisCluster> {
  const nodes = await Promise.all(
    Array.from({ length: masters }, () =>
      startRedisServer([
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        'nodes.conf',
        '--cluster-node-timeout',
        '2000',
      ]),
    ),
  );
  const stop = async () => {
    await Promise.all(nodes.map((node) => node.stop()));
  };
  try {
    const clients = nodes.map((node) => node.client());
    const share = Math.ceil(16384 / masters);
    await Promise.all(
      clients.map((client, i) =>
        client.call('CLUSTER', 'ADDSLOTSRANGE', String(i * share), String(Math.min(16383, (i + 1) * share - 1))),
      ),
    );
    await Promise.all(nodes.slice(1).map((node) => clients[0].call('CLUSTER', 'MEET', '127.0.0.1', String(node.port))));
    // Gossip settles in well under a second; poll a bounded number of times.
    for (let attempt = 0; ; attempt += 1) {
      const states = await Promise.all(clients.map((client) => client.call('CLUSTER', 'INFO') as Promise<string>));
      const known = await Promise.all(clients.map((client) => client.call('CLUSTER', 'NODES') as Promise<string>));
      const ready = states.every((info) => info.includes('cluster_state:ok'));
      const joined = known.every((list) => list.trim().split('\n').length === masters);
      if (ready && joined) break;
      if (attempt >= 200) throw new Error(`cluster not ready after ${attempt} checks:\n${states.join('\n')}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    nodes,
    startupNodes: nodes.map((node) => ({ host: '127.0.0.1', port: node.port })),
    stop,
  };
}

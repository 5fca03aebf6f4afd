import { type ChildProcess, spawn } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { Redis } from 'ioredis';
import { until } from './poll.js';
import type { TlsFiles } from './tls-certs.js';

/** A redis-server process this test file started, on a loopback port of its own. */
export interface RedisServer {
  readonly port: number;
  readonly url: string;
  readonly pid: number;
  /** A new client; closed by `stop()`. */
  client(): Redis;
  /** Ends the process at once (SIGKILL), as a crash would; `stop()` still cleans up. */
  kill(): Promise<void>;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of running) child.kill('SIGKILL');
});

/**
 * Starts `redis-server` (from PATH or `REDIS_SERVER_BIN`) on a free loopback port, with no
 * persistence; with `tls`, that port speaks TLS only (its `url` is `rediss://`).
 */
export async function startRedisServer(
  extraArgs: readonly string[] = [],
  port?: number,
  tls?: TlsFiles,
): Promise<RedisServer> {
  return startProcess((dir) => ({ args: extraArgs, readyLine: 'Ready to accept connections', dir, tls }), port);
}

/** A TLS-only server's arguments: no plain port, clients not asked for certificates. */
function tlsArgs(tls: TlsFiles, port: number): string[] {
  return [
    '--port',
    '0',
    '--tls-port',
    String(port),
    '--tls-cert-file',
    tls.certFile,
    '--tls-key-file',
    tls.keyFile,
    '--tls-ca-cert-file',
    tls.caFile,
    '--tls-auth-clients',
    'no',
    '--tls-replication',
    'yes',
  ];
}

interface LaunchPlan {
  /** Arguments before `--port` (a config file must come first). */
  leadingArgs?: readonly string[];
  args: readonly string[];
  /** The log line that says the process serves. */
  readyLine: string;
  dir: string;
  /** Serve TLS only, with these files. */
  tls?: TlsFiles;
}

async function startProcess(plan: (dir: string, port: number) => LaunchPlan, fixedPort?: number): Promise<RedisServer> {
  const binary = findRedisServer();
  for (let attempt = 1; ; attempt += 1) {
    try {
      const port = fixedPort ?? (await freePort());
      const dir = mkdtempSync(join(tmpdir(), 'rl-redis-'));
      return await launch(binary, port, plan(dir, port));
    } catch (error) {
      // Another process may take the port between our probe and redis-server's bind.
      if (fixedPort || attempt >= 3 || !String(error).includes('Address already in use')) throw error;
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

async function launch(binary: string, port: number, plan: LaunchPlan): Promise<RedisServer> {
  const { dir } = plan;
  const child = spawn(
    binary,
    [
      ...(plan.leadingArgs ?? []),
      ...(plan.tls ? tlsArgs(plan.tls, port) : ['--port', String(port)]),
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
      ...plan.args,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  running.add(child);
  let output = '';
  await new Promise<void>((resolve, reject) => {
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes(plan.readyLine)) {
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
    url: `${plan.tls ? 'rediss' : 'redis'}://127.0.0.1:${port}`,
    pid: child.pid!,
    client() {
      const tls = plan.tls && { ca: plan.tls.ca };
      const client = new Redis({ host: '127.0.0.1', port, lazyConnect: false, maxRetriesPerRequest: 1, tls });
      // A server killed on purpose: its clients' reconnect errors are expected, not news.
      client.on('error', () => undefined);
      clients.push(client);
      return client;
    },
    async kill() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await exited;
      }
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

/** A Redis Cluster this test file started: each node a redis-server on its own port. */
export interface RedisCluster {
  /** The masters, in slot order (the first owns the lowest slots). */
  readonly nodes: readonly RedisServer[];
  /** `replicas[i]` replicates `nodes[i]` (empty without replicas). */
  readonly replicas: readonly RedisServer[];
  /** `{ host, port }` of every master, for `new Cluster(...)` or `redis: { cluster }`. */
  readonly startupNodes: { host: string; port: number }[];
  stop(): Promise<void>;
}

const CLUSTER_NODE_ARGS = [
  '--cluster-enabled',
  'yes',
  '--cluster-config-file',
  'nodes.conf',
  '--cluster-node-timeout',
  '2000',
];

/**
 * Starts `masters` cluster-enabled redis-servers, gives each an even share of the 16384 slots,
 * optionally one replica each, joins them, and resolves once every node reports
 * `cluster_state:ok` and every replica is in sync.
 */
export async function startRedisCluster(masters = 3, withReplicas = false): Promise<RedisCluster> {
  const start = () => Promise.all(Array.from({ length: masters }, () => startRedisServer(CLUSTER_NODE_ARGS)));
  const nodes = await start();
  const replicas = withReplicas ? await start() : [];
  const all = [...nodes, ...replicas];
  const stop = async () => {
    await Promise.all(all.map((node) => node.stop()));
  };
  try {
    const clients = all.map((node) => node.client());
    const share = Math.ceil(16384 / masters);
    await Promise.all(
      clients
        .slice(0, masters)
        .map((client, i) =>
          client.call('CLUSTER', 'ADDSLOTSRANGE', String(i * share), String(Math.min(16383, (i + 1) * share - 1))),
        ),
    );
    await Promise.all(all.slice(1).map((node) => clients[0].call('CLUSTER', 'MEET', '127.0.0.1', String(node.port))));
    // Gossip settles in well under a second; poll for a bounded time.
    const settle = (check: () => Promise<boolean>, what: string) =>
      until(check, { timeoutMs: 15_000, intervalMs: 50, what: `cluster: ${what}` });
    await settle(async () => {
      const known = await Promise.all(clients.map((client) => client.call('CLUSTER', 'NODES') as Promise<string>));
      return known.every((list) => list.trim().split('\n').length === all.length);
    }, 'every node knowing every other');
    if (withReplicas) {
      const ids = await Promise.all(
        clients.slice(0, masters).map((client) => client.call('CLUSTER', 'MYID') as Promise<string>),
      );
      await Promise.all(clients.slice(masters).map((client, i) => client.call('CLUSTER', 'REPLICATE', ids[i])));
      await settle(async () => {
        const links = await Promise.all(clients.slice(masters).map((client) => client.info('replication')));
        return links.every((info) => info.includes('master_link_status:up'));
      }, 'replicas in sync');
    }
    await settle(async () => {
      const states = await Promise.all(clients.map((client) => client.call('CLUSTER', 'INFO') as Promise<string>));
      return states.every((info) => info.includes('cluster_state:ok'));
    }, 'cluster_state:ok');
  } catch (error) {
    await stop();
    throw error;
  }
  return {
    nodes,
    replicas,
    startupNodes: nodes.map((node) => ({ host: '127.0.0.1', port: node.port })),
    stop,
  };
}

/** A master, its replica and three sentinels this test file started. */
export interface RedisSentinelSet {
  readonly name: string;
  readonly master: RedisServer;
  readonly replica: RedisServer;
  readonly sentinels: readonly RedisServer[];
  /** `{ host, port }` of every sentinel, for `redis: { sentinels, name }`. */
  readonly sentinelAddresses: { host: string; port: number }[];
  stop(): Promise<void>;
}

/**
 * Starts a master, a replica of it and three sentinels (quorum 2) that notice a failure after
 * `downAfterMs`; resolves once every sentinel knows the replica and the other sentinels.
 */
export async function startRedisSentinelSet(
  downAfterMs = 1_000,
  name = 'mymaster',
  tls?: TlsFiles,
): Promise<RedisSentinelSet> {
  const master = await startRedisServer([], undefined, tls);
  const started: RedisServer[] = [master];
  const stop = async () => {
    await Promise.all(started.map((server) => server.stop()));
  };
  try {
    const replica = await startRedisServer(['--replicaof', '127.0.0.1', String(master.port)], undefined, tls);
    started.push(replica);
    const replicaClient = replica.client();
    await until(async () => (await replicaClient.info('replication')).includes('master_link_status:up'), {
      timeoutMs: 10_000,
      intervalMs: 50,
      what: 'the replica syncing with its master',
    });
    const sentinels: RedisServer[] = [];
    for (let i = 0; i < 3; i += 1) {
      const sentinel = await startProcess((dir) => {
        const config = join(dir, 'sentinel.conf');
        writeFileSync(
          config,
          [
            `sentinel monitor ${name} 127.0.0.1 ${master.port} 2`,
            `sentinel down-after-milliseconds ${name} ${downAfterMs}`,
            `sentinel failover-timeout ${name} 10000`,
            `sentinel parallel-syncs ${name} 1`,
            '',
          ].join('\n'),
        );
        return { leadingArgs: [config, '--sentinel'], args: [], readyLine: '+monitor master', dir, tls };
      });
      sentinels.push(sentinel);
      started.push(sentinel);
    }
    // Sentinels discover the replica and each other through the master, within a few seconds.
    const clients = sentinels.map((sentinel) => sentinel.client());
    const field = (view: string[], key: string) => Number(view[view.indexOf(key) + 1]);
    await until(
      async () => {
        const views = await Promise.all(
          clients.map((client) => client.call('SENTINEL', 'MASTER', name) as Promise<string[]>),
        );
        return views.every((view) => field(view, 'num-slaves') >= 1 && field(view, 'num-other-sentinels') >= 2);
      },
      { timeoutMs: 15_000, intervalMs: 50, what: 'the sentinels discovering the replica and each other' },
    );
    return {
      name,
      master,
      replica,
      sentinels,
      sentinelAddresses: sentinels.map((sentinel) => ({ host: '127.0.0.1', port: sentinel.port })),
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}

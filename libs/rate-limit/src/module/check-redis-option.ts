import type { RateLimitRedisOptions } from './options.js';

/** Stops the app naming the field, the problem and (when given) the value. */
export type Fail = (field: string, problem: string, ...value: [unknown?]) => never;

/** The URL schemes ioredis reads as Redis (`rediss:` with TLS); it would read any other as a host name. */
const REDIS_SCHEME = /^rediss?:\/\//i;
const REDIS_FORMS =
  "a redis:// or rediss:// URL, a Unix socket's path, ioredis options, { cluster: [...] } or { client }";

/**
 * Checks `redis` in the forms ioredis takes, so a mistake stops the app at bootstrap, naming what is
 * wrong, instead of becoming a client that retries a wrong address for ever (ioredis reads
 * `'http://host'` or `'host:6379x'` as some host, and a Sentinel group without its name fails only
 * when it connects). Never shows a password: URLs are shown without their credentials.
 */
export function checkRedis(redis: unknown, fail: Fail): RateLimitRedisOptions | undefined {
  if (redis === undefined) return undefined;
  const wrong = (problem: string, ...value: [unknown?]): never => fail('redis', problem, ...value);
  if (typeof redis === 'string') {
    checkRedisUrl(redis, 'must be', wrong);
    return redis;
  }
  if (redis === null || typeof redis !== 'object' || Array.isArray(redis)) {
    return wrong(`must be ${REDIS_FORMS}`, typeof redis === 'number' ? redis : typeof redis);
  }
  const given = redis as Record<string, unknown>;
  const others = (allowed: readonly string[]): string[] => Object.keys(given).filter((key) => !allowed.includes(key));
  if ('client' in given) {
    const { client } = given;
    if (!isRedisClient(client)) {
      wrong('{ client } must be an ioredis Redis or Cluster instance (with evalsha() and status)', kindOf(client));
    }
    const extra = others(['client']);
    if (extra.length > 0)
      wrong(`{ client } takes no other field: the client is used as it is, got ${extra.join(', ')}`);
    return redis as RateLimitRedisOptions;
  }
  if ('cluster' in given) {
    const { cluster: nodes, options } = given;
    if (!Array.isArray(nodes) || nodes.length === 0) {
      wrong('{ cluster } must list at least one node ({ host, port }, "host:port" or a port)', kindOf(nodes));
    }
    for (const node of nodes as unknown[]) {
      if (!isNodeAddress(node)) wrong('{ cluster } has a node that is no { host, port }, "host:port" or port', node);
    }
    if (options !== undefined && (options === null || typeof options !== 'object')) {
      wrong('{ cluster } options must be ioredis ClusterOptions (an object)', kindOf(options));
    }
    const extra = others(['cluster', 'options']);
    if (extra.length > 0) {
      wrong(`{ cluster } takes only 'cluster' and 'options' (ioredis ClusterOptions), got ${extra.join(', ')}`);
    }
    return redis as RateLimitRedisOptions;
  }
  // ioredis options, with an optional `url` that they complete.
  const { url, host, port, path, sentinels, name } = given;
  if (url !== undefined) {
    if (typeof url !== 'string') wrong('url must be a string', kindOf(url));
    checkRedisUrl(url as string, 'url must be', wrong);
  }
  if (host !== undefined && (typeof host !== 'string' || host.trim() === '')) wrong('host must be a host name', host);
  if (port !== undefined && !isPort(typeof port === 'string' ? Number(port) : port)) {
    wrong('port must be a whole number from 1 to 65535', port);
  }
  if (path !== undefined && (typeof path !== 'string' || path === '')) wrong("path must be a Unix socket's path", path);
  if (sentinels !== undefined) {
    if (!Array.isArray(sentinels) || sentinels.length === 0) {
      wrong('sentinels must list at least one sentinel ({ host, port })', kindOf(sentinels));
    }
    for (const sentinel of sentinels as unknown[]) {
      if (!isNodeAddress(sentinel) || typeof sentinel !== 'object') {
        wrong('sentinels has an entry that is no { host, port }', sentinel);
      }
    }
    if (typeof name !== 'string' || name === '') {
      wrong("has sentinels but no 'name': the master's name the sentinels know (e.g. 'mymaster')", name);
    }
  }
  return redis as RateLimitRedisOptions;
}

function checkRedisUrl(url: string, must: string, wrong: (problem: string, ...value: [unknown?]) => never): void {
  if (url.trim() === '') wrong(`${must} ${REDIS_FORMS}, not empty`, url);
  // ioredis reads a path (`/run/redis.sock`, with `?db=1` if need be) as a Unix socket.
  if (url.startsWith('/') && !url.startsWith('//')) return;
  if (!REDIS_SCHEME.test(url)) {
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(url)?.[1];
    const instead = scheme ? `, not ${scheme}://` : ': write redis:// before the host';
    wrong(`${must} a redis:// or rediss:// URL (or a Unix socket's path)${instead}`, redactUrl(url));
  }
  try {
    new URL(url);
  } catch {
    wrong(`${must} a valid URL (redis://[[user]:password@]host[:port][/db])`, redactUrl(url));
  }
}

/** The URL with its user and password replaced, for an error message that may be logged. */
function redactUrl(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/i, '$1***@');
}

function isRedisClient(client: unknown): boolean {
  // Duck-typed, as an app may have its own copy of ioredis: the calls the library makes.
  const candidate = client as { evalsha?: unknown; status?: unknown; on?: unknown } | null;
  return (
    typeof candidate === 'object' &&
    candidate !== null &&
    typeof candidate.evalsha === 'function' &&
    typeof candidate.status === 'string' &&
    typeof candidate.on === 'function'
  );
}

function isPort(port: unknown): boolean {
  return Number.isInteger(port) && (port as number) >= 1 && (port as number) <= 65_535;
}

/** A node as ioredis takes one: `{ host?, port? }`, `'host:port'` (or a URL) or a port. */
function isNodeAddress(node: unknown): boolean {
  if (typeof node === 'number') return isPort(node);
  if (typeof node === 'string') return node.trim() !== '';
  if (node === null || typeof node !== 'object') return false;
  const { host, port } = node as { host?: unknown; port?: unknown };
  return (
    (host !== undefined || port !== undefined) &&
    (host === undefined || (typeof host === 'string' && host !== '')) &&
    (port === undefined || isPort(typeof port === 'string' ? Number(port) : port))
  );
}

function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return value.length === 0 ? 'an empty array' : 'an array';
  if (typeof value === 'object') return `an object (${value.constructor?.name ?? 'no class'})`;
  return typeof value;
}

/** A value as an error message shows it. */
export function describe(value: unknown): string {
  if (typeof value === 'function') return 'a function';
  return JSON.stringify(value) ?? String(value);
}

import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';

/**
 * A Lua script sent by SHA1 (EVALSHA), and re-sent whole (EVAL, which also caches it) when the
 * server answers NOSCRIPT: after `SCRIPT FLUSH`, a restart, or a failover to a node that never saw it.
 * Keys go only through KEYS, so Cluster routes the call to the keys' slot.
 */
export class RedisScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(client: Redis | Cluster, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    try {
      return await client.evalsha(this.sha, keys.length, ...keys, ...args);
    } catch (error) {
      if (!isNoScript(error)) throw error;
      return client.eval(this.source, keys.length, ...keys, ...args);
    }
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

import { createHash } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';

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

  run(client: Redis | Cluster, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return client.evalsha(this.sha, keys.length, ...keys, ...args).catch((error: unknown) => {
      if (!isNoScript(error)) throw error;
      return client.eval(this.source, keys.length, ...keys, ...args);
    });
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/**
 * A script in variants by the algorithms its call uses, each built on first use and kept: Redis
 * runs a script's whole body on every call, so a call pays only for the algorithms it decides.
 * At most one variant per set of algorithms (31).
 */
export class ScriptsByAlgorithms {
  private readonly built = new Map<string, RedisScript>();

  constructor(
    private readonly name: string,
    private readonly source: (algorithms: ReadonlySet<RateLimitAlgorithmName>) => string,
  ) {}

  /** The variant for the algorithms of these hits. */
  for(hits: readonly { readonly algorithm: RateLimitAlgorithmName }[]): RedisScript {
    const id =
      hits.length === 1
        ? hits[0].algorithm
        : ALGORITHM_NAMES.filter((name) => hits.some((hit) => hit.algorithm === name)).join('+');
    let script = this.built.get(id);
    if (!script) {
      script = new RedisScript(this.name, this.source(new Set(hits.map((hit) => hit.algorithm))));
      this.built.set(id, script);
    }
    return script;
  }
}

import type { LoggerService } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { withDeadline } from './redis-timeout.js';
import { isCluster } from './is-cluster.js';
import { mastersOf } from './masters.js';

/** What Redis says of its memory (every master of a Cluster), for the health check. */
export interface RedisMemoryState {
  /** `maxmemory` in bytes, the least of the masters that set one; 0: no limit. */
  maxmemory: number;
  /** `maxmemory-policy`: of the first master that evicts, else of the first. */
  policy: string;
  /** `evicted_keys` since each master started, summed. */
  evictedKeys: number;
  /** Whether Redis evicted keys since the last check, under a policy that evicts: counters may be lost. */
  evicting: boolean;
}

/** Whether Redis, once full, evicts keys under `policy` (rather than refusing writes). */
function evicts(policy: string): boolean {
  return policy !== 'noeviction';
}

/**
 * Watches a Redis that may fill up. Every rate-limit key carries a TTL, so under `maxmemory` with
 * any evicting policy (`allkeys-*` and `volatile-*` alike: a `volatile-*` policy evicts only keys
 * with a TTL, which all of these are) Redis silently evicts counters, lifting limits and lockouts.
 * Under `noeviction` a full Redis refuses writes with `OOM`, and requests follow the store-error
 * policies (`neverReachedRedis`). Read from `INFO memory` and `INFO stats`: one call, which managed
 * Redis services and least-privilege users allow where `CONFIG GET` is often renamed or refused, and
 * which has `evicted_keys` too.
 */
export class RedisMemory {
  /** What was warned of already: each master's policy and limit, once. */
  private readonly warned = new Set<string>();
  private lastEvicted: number | undefined;

  constructor(
    private readonly client: Redis | Cluster,
    /** How long a check waits for each master, unless told otherwise: the call deadline. */
    private readonly timeoutMs: number,
    private readonly logger: LoggerService,
    private readonly describe: () => string,
  ) {}

  /**
   * Reads every master's memory settings, warns of an evicting one (once per setting), and tells
   * whether keys were evicted since the last check. Rejects when a master does not answer within `timeoutMs`.
   */
  async check(timeoutMs = this.timeoutMs): Promise<RedisMemoryState> {
    const masters = mastersOf(this.client);
    const infos = await Promise.all(
      masters.map((node) => withDeadline(node.call('INFO', 'memory', 'stats'), timeoutMs, 'INFO memory').then(String)),
    );
    let maxmemory = 0;
    let policy: string | undefined;
    let evictedKeys = 0;
    infos.forEach((info, i) => {
      const limit = Number(field(info, 'maxmemory') ?? 0);
      const nodePolicy = field(info, 'maxmemory_policy') ?? 'noeviction';
      evictedKeys += Number(field(info, 'evicted_keys') ?? 0);
      if (limit > 0 && (maxmemory === 0 || limit < maxmemory)) maxmemory = limit;
      if (policy === undefined || (limit > 0 && evicts(nodePolicy) && !evicts(policy))) policy = nodePolicy;
      if (limit > 0 && evicts(nodePolicy)) this.warn(this.where(masters[i]), limit, nodePolicy);
    });
    const evicting =
      maxmemory > 0 && evicts(policy!) && this.lastEvicted !== undefined && evictedKeys > this.lastEvicted;
    this.lastEvicted = evictedKeys;
    return { maxmemory, policy: policy!, evictedKeys, evicting };
  }

  private warn(where: string, maxmemory: number, policy: string): void {
    const setting = `${where} ${maxmemory} ${policy}`;
    if (this.warned.has(setting)) return;
    this.warned.add(setting);
    this.logger.warn(
      `Redis (${where}) evicts keys when full (maxmemory ${maxmemory} bytes, maxmemory-policy ${policy}): ` +
        'rate-limit counters all carry a TTL, so any evicting policy can evict them, which lifts limits and lockouts. ' +
        'Fix: maxmemory-policy noeviction on the Redis that holds them (a full Redis then refuses writes, and ' +
        'requests follow storeErrors.policy), or a Redis of their own with memory to spare.',
    );
  }

  private where(node: Redis): string {
    return isCluster(this.client) ? `${node.options.host}:${node.options.port}` : this.describe();
  }
}

/** A field of an INFO reply (`name:value` lines). */
function field(info: string, name: string): string | undefined {
  return new RegExp(`^${name}:(\\S*)`, 'm').exec(info)?.[1];
}

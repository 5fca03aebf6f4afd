import type { Cluster, Redis } from 'ioredis';
import { isCluster } from './is-cluster.js';
import type { ScriptRunner } from './script-runner.js';

/**
 * The replicas of the server this connection writes to, for a write a failover must not lose:
 * how many must have it (`toConfirm`), and waiting until they do (`wait`, Redis `WAIT`). Not for
 * Cluster, where WAIT cannot follow a key.
 */
export class Replicas {
  /** @param timeoutMs the call deadline, which a WAIT gets on top of its own timeout */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly runner: ScriptRunner,
    private readonly timeoutMs: number,
  ) {}

  /**
   * Waits until `replicas` replicas have every write so far on this connection (Redis `WAIT`), at
   * most `timeoutMs`; resolves with how many did. Cluster: 0.
   */
  async wait(replicas: number, timeoutMs: number): Promise<number> {
    if (isCluster(this.client)) return 0;
    const confirmed = await this.runner.operation(
      (client) => client.call('WAIT', replicas, timeoutMs),
      'WAIT',
      timeoutMs + this.timeoutMs,
    );
    return Number(confirmed);
  }

  /**
   * Replicas an operator's write must reach before it is confirmed, so a failover cannot lose it:
   * one behind Sentinel (which exists to fail over to one), one when the server reports any
   * connected; none for a lone server. Cluster: none (WAIT cannot follow a key there).
   */
  async toConfirm(): Promise<number> {
    const { client } = this;
    if (isCluster(client)) return 0;
    if (client.options.sentinels?.length) return 1;
    const info = await this.runner.operation((redis) => redis.info('replication'), 'INFO');
    return Number(/connected_slaves:(\d+)/.exec(info)?.[1] ?? 0) > 0 ? 1 : 0;
  }
}

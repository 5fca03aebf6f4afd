import type { StoreProblemLog } from '../../logging/store-problem-log.js';
import type { RedisService } from '../redis.service.js';

export interface ReplicaWaitOptions {
  replicas: number;
  timeoutMs: number;
}

/**
 * A failover defence for those who prefer latency to any loss: after each admitted request, Redis
 * `WAIT`s until `replicas` replicas have its counts, or `timeoutMs`. A shortfall is reported, not
 * refused: the counts are in the master, and a failover is what would lose them.
 */
export class ReplicaWait {
  constructor(
    private readonly redis: RedisService,
    private readonly options: ReplicaWaitOptions,
    private readonly problems: StoreProblemLog,
  ) {}

  async afterAdmission(): Promise<void> {
    const { replicas, timeoutMs } = this.options;
    const confirmed = await this.redis.replicas.wait(replicas, timeoutMs).catch(() => 0);
    if (confirmed < replicas) {
      this.problems.report('wait', 'Fewer replicas than waitForReplicas asks confirmed the counts in time');
    }
  }
}

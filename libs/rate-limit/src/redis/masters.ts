import type { Cluster, Redis } from 'ioredis';
import { isCluster } from './is-cluster.js';

/** The servers that hold the keys: every master of a Cluster, or the one server. */
export function mastersOf(client: Redis | Cluster): Redis[] {
  return isCluster(client) ? client.nodes('master') : [client];
}

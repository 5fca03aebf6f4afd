import { Cluster, type Redis } from 'ioredis';

/** The servers that hold the keys: every master of a Cluster, or the one server. */
export function mastersOf(client: Redis | Cluster): Redis[] {
  return client instanceof Cluster ? client.nodes('master') : [client];
}

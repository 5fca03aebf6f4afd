import type { Cluster, Redis } from 'ioredis';

/**
 * Whether a client is an ioredis Cluster. ioredis marks its clients (`isCluster`: true on a
 * Cluster, false on a Redis), so the library tells them apart without loading ioredis for an
 * `instanceof`, and a client from another copy of ioredis (the app's own) is still told right.
 */
export function isCluster(client: Redis | Cluster): client is Cluster {
  return client.isCluster === true;
}

/**
 * One Redis decision (the consume script over loopback): with and without the circuit breaker in
 * front of it, and with `failover.waitForReplicas` (Redis WAIT for one replica) against a master that has one.
 *
 *   npm run bench:redis
 */
import { afterAll, bench, describe } from 'vitest';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore, hit } from '../test/support/store-module.js';

const master = await startRedisServer();
const replica = await startRedisServer(['--replicaof', '127.0.0.1', String(master.port)]);
const replicaClient = replica.client();
for (let i = 0; i < 200 && !(await replicaClient.info('replication')).includes('master_link_status:up'); i += 1) {
  await new Promise((resolve) => setTimeout(resolve, 50));
}
const withBreaker = await createStore({ redis: master.url });
const withoutBreaker = await createStore({ redis: master.url, storeErrors: { circuitBreaker: false } });
const waiting = await createStore({ redis: master.url, failover: { waitForReplicas: { replicas: 1, timeoutMs: 50 } } });
const request = [hit('bench:{id}:r:fw', { limit: 1_000_000_000, windowMs: 60_000 })];

// At file level: declared inside the describe, this hook never ran in benchmark mode and left the
// servers running.
afterAll(async () => {
  await withBreaker.close();
  await withoutBreaker.close();
  await waiting.close();
  await replica.stop();
  await master.stop();
});

describe('one Redis decision', () => {
  bench('consume, circuit breaker on (default)', async () => {
    await withBreaker.store.consume(request);
  });
  bench('consume, circuit breaker off', async () => {
    await withoutBreaker.store.consume(request);
  });
  bench('consume, then WAIT for one replica (failover.waitForReplicas)', async () => {
    await waiting.store.consume(request);
  });
});

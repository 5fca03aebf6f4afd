/**
 * One Redis decision (the consume script over loopback) with and without the circuit breaker in
 * front of it, to keep the breaker's cost on the request path measured.
 *
 *   npm run bench:redis
 */
import { afterAll, bench, describe } from 'vitest';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore, hit } from '../test/support/store-module.js';

const server = await startRedisServer();
const withBreaker = await createStore({ redis: server.url });
const withoutBreaker = await createStore({ redis: server.url, circuitBreaker: false });
const request = [hit('bench:{id}:r:fw', { limit: 1_000_000_000, windowMs: 60_000 })];

describe('one Redis decision', () => {
  afterAll(async () => {
    await withBreaker.close();
    await withoutBreaker.close();
    await server.stop();
  });

  bench('consume, circuit breaker on (default)', async () => {
    await withBreaker.store.consume(request);
  });
  bench('consume, circuit breaker off', async () => {
    await withoutBreaker.store.consume(request);
  });
});

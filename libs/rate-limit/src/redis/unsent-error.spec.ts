import { BrokenCircuitError } from 'cockatiel';
import { describe, expect, it } from 'vitest';
import { RedisTimeoutError } from './call-safety.js';
import { UnsentCallsError, neverReachedRedis } from './unsent-error.js';

describe('neverReachedRedis', () => {
  it('is true only for failures that prove nothing was sent', () => {
    expect(neverReachedRedis(new BrokenCircuitError())).toBe(true);
    expect(neverReachedRedis(new Error("Stream isn't writeable and enableOfflineQueue options is false"))).toBe(true);
    expect(neverReachedRedis(new Error("Cluster isn't ready and enableOfflineQueue options is false"))).toBe(true);
    expect(neverReachedRedis(new UnsentCallsError('two slots, circuit open'))).toBe(true);
  });

  it('is false for failures after which the call may have run', () => {
    expect(neverReachedRedis(new RedisTimeoutError('Redis did not answer consume within 100 ms'))).toBe(false);
    expect(neverReachedRedis(new Error('Connection is closed.'))).toBe(false);
    const maxRetries = new Error('Reached the max retries per request limit (which is 1).');
    maxRetries.name = 'MaxRetriesPerRequestError';
    expect(neverReachedRedis(maxRetries)).toBe(false);
    expect(neverReachedRedis('something odd')).toBe(false);
  });
});

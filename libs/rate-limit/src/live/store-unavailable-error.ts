import { RedisTimeoutError } from '../redis/call-safety.js';
import { neverReachedRedis } from '../redis/unsent-error.js';

/**
 * Redis could not take a management call: it is full (`OOM` under `maxmemory-policy noeviction`),
 * or did not answer. The message says which, and what became of the change; try again once Redis
 * has room or answers. An admin endpoint answers it with 503.
 */
export class RateLimitStoreUnavailableError extends Error {
  override readonly name = 'RateLimitStoreUnavailableError';
}

const OUT_OF_MEMORY = /^OOM |\bOOM command not allowed\b/;
const NOT_ANSWERING = /Connection is closed|Stream isn't writeable|ECONNREFUSED|ECONNRESET/;

/** Why a failed call says Redis is unavailable, or undefined when it says something else. */
export function whyUnavailable(error: unknown): string | undefined {
  const message = error instanceof Error ? error.message : String(error);
  if (OUT_OF_MEMORY.test(message)) {
    return 'Redis is out of memory (maxmemory reached under maxmemory-policy noeviction) and refused the write; free memory there or raise maxmemory';
  }
  if (error instanceof RedisTimeoutError || neverReachedRedis(error) || NOT_ANSWERING.test(message)) {
    return `Redis did not answer (${message})`;
  }
  return undefined;
}

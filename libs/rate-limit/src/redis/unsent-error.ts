import { isBrokenCircuitError } from 'cockatiel';

/**
 * Whether a failed call certainly never reached Redis: the circuit was open, or the client had no
 * connection to send it on. Any other failure (a timeout, a connection dropped after the call was
 * written) may have run in Redis, and its request must not be counted again elsewhere.
 */
export function neverReachedRedis(error: unknown): boolean {
  if (isBrokenCircuitError(error)) return true;
  if (error instanceof UnsentCallsError) return true;
  const message = error instanceof Error ? error.message : '';
  return message.includes('enableOfflineQueue options is false');
}

/** Several calls of one request failed (Cluster slots), none of them sent, and nothing was left over. */
export class UnsentCallsError extends Error {
  override readonly name = 'UnsentCallsError';
}

import { isBrokenCircuitError } from 'cockatiel';

/**
 * Whether a failed call certainly never ran in Redis: the circuit was open, the client had no
 * connection to send it on, Redis was full and refused it (`OOM` under `maxmemory-policy
 * noeviction`: a script is refused at its first write, before it changed anything), or a Cluster
 * client gave up following redirections. Any other failure (a timeout, a connection dropped after the call was
 * written) may have run in Redis, and its request must not be counted again elsewhere.
 */
export function neverReachedRedis(error: unknown): boolean {
  if (isBrokenCircuitError(error)) return true;
  if (error instanceof UnsentCallsError) return true;
  const message = error instanceof Error ? error.message : '';
  return (
    message.includes('enableOfflineQueue options is false') ||
    /^OOM |\bOOM command not allowed\b/.test(message) ||
    // A Cluster client that gave up following the slot's moves: the command ran nowhere.
    message.startsWith('Too many Cluster redirections')
  );
}

/** Several calls of one request failed (Cluster slots), none of them sent, and nothing was left over. */
export class UnsentCallsError extends Error {
  override readonly name = 'UnsentCallsError';
}

import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import type { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { RateLimitStoreUnavailableError, whyUnavailable } from './store-unavailable-error.js';

/**
 * Redis refused a management call for lack of permission (an ACL without a command, a key or a
 * channel the call needs): the message names what Redis refused. Nothing was changed.
 */
export class RateLimitPermissionError extends Error {
  override readonly name = 'RateLimitPermissionError';
}

/** Redis's replies that say the user may not (a command, a key or a channel; in a script, or queued in MULTI). */
const PERMISSION_REFUSED = /\bNOPERM\b|The user executing the script can't/;

/**
 * Runs a call of `RateLimitManagementService` (`method`), a refusal by Redis for lack of permission
 * turned into a `RateLimitPermissionError` naming it, and a Redis full or not answering into a
 * `RateLimitStoreUnavailableError`, each saying what became of the change (`outcome`): refused past
 * the change log, a change may be made in part (a value written but not announced, counters deleted
 * but the news of it refused).
 */
export async function permitted<T>(
  method: string,
  call: () => Promise<T>,
  outcome = ' the change may be made in part: check it with get or inspect.',
): Promise<T> {
  try {
    return await call();
  } catch (error) {
    if (error instanceof RateLimitPermissionError || error instanceof RateLimitStoreUnavailableError) throw error;
    const message = error instanceof Error ? error.message : String(error);
    const unavailable = whyUnavailable(error);
    if (unavailable) {
      throw new RateLimitStoreUnavailableError(`RateLimitManagementService.${method}: ${unavailable};${outcome}`, {
        cause: error,
      });
    }
    if (!PERMISSION_REFUSED.test(message)) throw error;
    throw new RateLimitPermissionError(
      `RateLimitManagementService.${method}: Redis refused it for lack of permission (${message});${outcome} ` +
        'The Redis user needs the ACL in the docs (operations.md, "A least-privilege Redis user")',
    );
  }
}

/** The config centre, for a call that writes it (`method`); throws for one that holds no live values. */
export function writableCentre(centre: RateLimitConfigCentre, method: string): LiveConfigCentre {
  if (centre instanceof LiveConfigCentre) return centre;
  throw new RateLimitConfigurationError(
    `RateLimitManagementService.${method}: the config centre (${centre.constructor.name}) cannot be written while the app runs; use RedisConfigCentre (or MemoryConfigCentre for one instance) as 'configCentre'`,
  );
}

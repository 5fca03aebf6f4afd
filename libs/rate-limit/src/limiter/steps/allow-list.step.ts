import type { AllowList } from '../../rules/allow-list.js';
import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import type { LimitedRequest } from '../limited-request.js';
import type { LimiterStep, Prepare } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { Thresholds } from '../rule-thresholds.js';

/**
 * A rule's allow list, its `allow` or the one its config key gives: a request from an allowed
 * address (or with an allowed user agent from its networks) is not counted, nor resolved; one of an
 * allowed identity is resolved, then not counted. Outside HTTP, identities only.
 */
export class AllowListStep implements LimiterStep {
  prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
    request: LimitedRequest | undefined,
  ): PreparedRule | null | Promise<PreparedRule | null> {
    const { allow } = thresholds;
    if (!allow) return next(rule, thresholds);
    if (request && allow.readsRequest && allow.allowsClient(request.address, request.userAgent())) return null;
    return unlessIdentityAllowed(next(rule, thresholds), allow);
  }
}

/**
 * A prepared rule, or null where the list allows the identity it counts (known only once prepared):
 * a rule's allow list, and the module's.
 */
export function unlessIdentityAllowed(prepared: ReturnType<Prepare>, list: AllowList): ReturnType<Prepare> {
  if (!list.readsIdentities) return prepared;
  if (!(prepared instanceof Promise)) return prepared && list.allowsIdentity(prepared.identity) ? null : prepared;
  return prepared.then((p) => (p && list.allowsIdentity(p.identity) ? null : p));
}

import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import type { RateLimitRefund } from '../../store/rate-limit-store.js';
import type { PreparedRule } from '../prepare-hits.js';

/**
 * What an admitted request holds until it is done under the rules that `hold` (units in flight by
 * `countOn`, a `settleCost` reservation): the store's receipt of each, made into what the outcome
 * keeps; undefined when it holds none (refused, or no receipt).
 */
export function heldUnits<Held>(
  prepared: readonly PreparedRule[],
  consumption: ResilientConsumption | undefined,
  holds: (rule: RateLimitRule) => boolean,
  made: (rule: RateLimitRule, refund: RateLimitRefund) => Held,
): Held[] | undefined {
  const receipts = consumption?.receipts;
  if (!receipts) return undefined;
  let held: Held[] | undefined;
  prepared.forEach(({ rule, hit }, i) => {
    const receipt = receipts[i];
    if (receipt && holds(rule)) (held ??= []).push(made(rule, { hit, receipt }));
  });
  return held;
}

import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import type { RateLimitReceipt } from '../../store/rate-limit-store.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';

/**
 * Rules in `'shadow'` mode: they never refuse a request (`consumeEnforced`). A rule may be switched
 * to it live (its `configKey`'s `mode`), so every rule with a `configKey` uses the step too.
 */
export class ShadowStep implements LimiterStep {
  consume(prepared: readonly PreparedRule[], next: Consume): Promise<ResilientConsumption> {
    return consumeEnforced(prepared, next);
  }
}

/**
 * One store call; and when only `'shadow'` rules refused, another without them, since they never
 * refuse a request and a refused call counted nothing of the rules that admitted. So a shadowed
 * rule's counter moves only with the request's admission, never in its stead. Decisions and
 * receipts are those of `prepared`, in order; a shadowed rule that refused has its refusal and no
 * receipt.
 */
async function consumeEnforced(prepared: readonly PreparedRule[], consumeOf: Consume): Promise<ResilientConsumption> {
  const first = await consumeOf(prepared);
  if (first.allowed || !prepared.some((p) => p.thresholds.mode === 'shadow')) return first;
  const decisions = [...first.decisions];
  const receipts: RateLimitReceipt[] = [];
  let asked = prepared.map((_, i) => i);
  let consumption = first;
  while (!consumption.allowed) {
    const refusing = asked.filter((_, j) => !consumption.decisions[j].allowed);
    if (refusing.length === 0 || refusing.some((i) => prepared[i].thresholds.mode !== 'shadow')) break;
    asked = asked.filter((i) => !refusing.includes(i));
    if (asked.length === 0) {
      consumption = { allowed: true, decisions: [], receipts: [] };
      break;
    }
    consumption = await consumeOf(asked.map((i) => prepared[i]));
    asked.forEach((i, j) => (decisions[i] = consumption.decisions[j]));
  }
  if (consumption.receipts) asked.forEach((i, j) => (receipts[i] = consumption.receipts![j]));
  const merged: ResilientConsumption = {
    allowed: consumption.allowed,
    decisions,
    receipts: consumption.allowed ? receipts : undefined,
  };
  if (consumption.storeError) merged.storeError = consumption.storeError;
  return merged;
}

import { parseCount } from './duration.js';
import type { Fail, RateLimitRule } from './compiled-rule.js';
import type { RateLimitCountOn, RateLimitOptions } from './rule-options.js';

/** `settleCost` checked, as the rule keeps it: its function of the result, and the most a request may cost. */
export function settledCost(
  options: RateLimitOptions,
  cost: NonNullable<RateLimitOptions['cost']>,
  countOn: RateLimitCountOn,
  fail: Fail,
): Pick<RateLimitRule, 'settleCost' | 'maxCost'> {
  const given = options.settleCost;
  if (given === undefined) return { settleCost: undefined, maxCost: undefined };
  if (typeof given === 'function') {
    fail(
      'settleCost',
      "must be { actual, max } (0.3): the function is 'settleCost.actual', 'maxCost' is 'settleCost.max'",
      given,
    );
  }
  if (given === null || typeof given !== 'object') {
    fail(
      'settleCost',
      "must be { actual, max }: a function of the handler's result giving what the request cost, and the most one request can cost",
      given,
    );
  }
  if (typeof given.actual !== 'function') {
    fail('settleCost.actual', "must be a function of the handler's result and the context", given.actual);
  }
  // Each decides what stays counted after the handler; one rule takes one of them.
  if (countOn !== 'all') fail('settleCost', "cannot be combined with 'countOn'", given);
  // A leased unit is this instance's, which a charge past it could not reach.
  if (options.lease !== undefined) fail('settleCost', "cannot be combined with 'lease'", given);
  const { max } = given;
  // Without it, requests in flight together could each overdraw the budget: no bound at all.
  if (max === undefined) {
    fail(
      'settleCost.max',
      "is required: the most one request can really cost, so that requests in flight together never overdraw the budget by more than one request's overdraft",
      max,
    );
  }
  if (typeof max !== 'function') {
    if (typeof max !== 'number' || parseCount(max) === undefined) {
      fail('settleCost.max', 'must be a positive whole number or a function of the ExecutionContext', max);
    }
    if (typeof cost === 'number' && max < cost)
      fail('settleCost.max', `is less than the reservation ('cost': ${cost})`, max);
  }
  return { settleCost: given.actual, maxCost: max };
}

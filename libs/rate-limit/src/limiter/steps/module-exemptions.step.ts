import type { ModuleExemptions } from '../exemptions.js';
import { type LimiterStep, NOT_COUNTED, type Prepare, type Screening } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitRule } from '../../rules/rate-limit-rule.js';
import type { Thresholds } from '../rule-thresholds.js';
import { unlessIdentityAllowed } from './allow-list.step.js';

/**
 * The module's `allow` and `skipIf`: a request from an allowed address (or user agent from its
 * networks), or one `skipIf` skips, is counted by no rule and gets no headers; an allowed identity
 * is not counted by the rules that count it under that identity (outside HTTP too).
 */
export class ModuleExemptionsStep implements LimiterStep {
  constructor(private readonly exemptions: ModuleExemptions) {}

  screen({ request }: Screening): typeof NOT_COUNTED | undefined | Promise<typeof NOT_COUNTED | undefined> {
    if (!request) return undefined;
    const skipped = this.exemptions.skipsRequest(request);
    if (skipped === true) return NOT_COUNTED;
    if (skipped === false) return undefined;
    return skipped.then((skip) => (skip ? NOT_COUNTED : undefined));
  }

  prepare(
    rule: RateLimitRule,
    thresholds: Thresholds,
    next: Prepare,
  ): PreparedRule | null | Promise<PreparedRule | null> {
    const list = this.exemptions.list();
    const prepared = next(rule, thresholds);
    return list ? unlessIdentityAllowed(prepared, list) : prepared;
  }
}

import { EVERY_RULE, type IdentityControls } from '../../limiter/rate-limit-config-centre.js';
import type { LimiterStep, Screening, StepKit } from '../../limiter/limiter-step.js';
import type { PreparedRule } from '../../limiter/prepare-hits.js';
import { type RateLimitOutcome, type RuleDecision, rateLimitOutcome } from '../../limiter/rate-limit-outcome.js';

/**
 * Bans (`RateLimitManagementService.ban`): while any is held, a request's identities are looked up
 * before anything else, its exemptions too: an allow list, a user agent or a `skipIf` never lets a
 * banned identity through. Refused without a store call when an identity the request is counted
 * under is banned by one of its rules (or by every rule, `'*'`), or its client's address is: the
 * ban that ends last says when to retry. Without bans, it asks nothing.
 */
export class BansStep implements LimiterStep {
  constructor(
    private readonly controls: IdentityControls,
    private readonly kit: StepKit,
  ) {}

  screen(screening: Screening): Promise<RateLimitOutcome | undefined> | undefined {
    // A request no rule in force counts is not looked up: an address ban answers with a rule's refusal.
    if (!this.controls.anyBans || screening.rules.length === 0) return undefined;
    return this.identified(screening).then((prepared) => this.bannedOutcome(screening, prepared));
  }

  /** The request's rules as their `by` counts them; a rule whose resolver throws reports it when decided. */
  private async identified({ rules, prepared }: Screening): Promise<PreparedRule[]> {
    const identified: PreparedRule[] = [];
    await Promise.all(
      rules.map(async (rule) => {
        try {
          identified.push(await prepared(rule));
        } catch {
          // Its decision reports the failure, unless an exemption spares the request that resolver.
        }
      }),
    );
    return identified;
  }

  private bannedOutcome(
    { rules, request }: Screening,
    prepared: readonly PreparedRule[],
  ): RateLimitOutcome | undefined {
    const { controls, kit } = this;
    const now = kit.now();
    let until = 0;
    let by: PreparedRule | undefined;
    let identity = '';
    for (const p of prepared) {
      const ends = controls.banUntil(p.rule.name, p.identity, now);
      if (ends !== undefined && ends > until) [until, by, identity] = [ends, p, p.identity];
    }
    let byAddress = false;
    const address = request?.address;
    if (address) {
      // The address as a `by: 'ip'` rule counts it, so a ban of a client's /64 finds each of its addresses.
      const counted = kit.clientIdentity(address);
      const ends = controls.banUntil(EVERY_RULE, counted, now);
      if (ends !== undefined && ends > until) [until, by, identity, byAddress] = [ends, prepared[0], counted, true];
    }
    if (!by && !byAddress) return undefined;
    // With no rule prepared (each resolver threw), an address ban answers with the first in force.
    const rule = by?.rule ?? rules[0];
    // A '*' ban, when it is the one that ends last: the message names no rule.
    const bannedUnder = byAddress || controls.banUntil(EVERY_RULE, identity, now) === until ? EVERY_RULE : rule.name;
    const thresholds = by?.thresholds ?? kit.thresholdsOf(rule);
    const decision: RuleDecision = {
      allowed: false,
      limit: thresholds.count,
      remaining: 0,
      resetMs: until - now,
      rule,
      identity,
      windowMs: thresholds.windowMs,
      cost: by?.hit.cost ?? 0,
      fallback: false,
      mode: 'enforce',
    };
    const outcome = rateLimitOutcome([decision], false, []);
    outcome.banned = true;
    outcome.bannedUnder = bannedUnder;
    return outcome;
  }
}

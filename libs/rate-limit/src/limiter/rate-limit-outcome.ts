import type { RateLimitMode, RateLimitRule } from '../rules/rate-limit-rule.js';
import type { RateLimitStoreErrorPolicy } from '../resilience/store-error-policy.js';
import { type RateLimitDecision, type RateLimitRefund, remainingAfter } from '../store/rate-limit-store.js';
import type { ResilientConsumption } from '../resilience/deciding-store.js';
import type { PreparedRule } from './prepare-hits.js';

/*
 * What the limiter decided for a request, and how it is told over HTTP: the rate-limit headers of
 * every decided response, and the 429 of a refused one.
 */

/** One rule's decision for one request. */
export interface RuleDecision extends RateLimitDecision {
  rule: RateLimitRule;
  identity: string;
  /** The window in force for this request (the config centre may have changed the rule's). */
  windowMs: number;
  /** Units this request asked of the rule. */
  cost: number;
  /**
   * True when the store failed and the rule's store-error policy decided (`'local'`, `'allow'` or
   * `'deny'`; `RateLimitOutcome.storeError` says which): such decisions send no `RateLimit-*` headers.
   */
  fallback: boolean;
  /**
   * The rule's mode for this request. A `'shadow'` decision never refuses the request: one with
   * `allowed: false` is a would-be rejection. Shadowed rules send no headers.
   */
  mode: RateLimitMode;
  /** Set when this admission took the identity's use to the rule's `nearLimit` share or past it. */
  nearLimit?: true;
}

/** What `onNearLimit` is told: a rule's `nearLimit` share crossed by an identity's admission. */
export interface RateLimitNearLimitEvent {
  rule: string;
  identity: string;
  limit: number;
  remaining: number;
  /** Until the window (or bucket) is full again, in ms. */
  resetMs: number;
}

/** What the limiter decided for a request. */
export interface RateLimitOutcome {
  decisions: readonly RuleDecision[];
  /**
   * The decision that sets the headers: the rejecting rule with the longest wait; else, of the rules
   * the store decided, one with nothing left, then a `settleCost` rule's budget, then the tightest
   * (none when the fallback decided every rule of an admitted request).
   */
  reported: RuleDecision | undefined;
  allowed: boolean;
  /** Admitted units of rules with `countOn` other than `'all'` and caps' slots, to settle when the response ends. */
  conditional: readonly ConditionalUnits[];
  /** Units reserved by rules with `settleCost`, to settle with what the request really cost. */
  reserved: readonly ReservedUnits[];
  /** Set when the store failed and this policy decided the request. */
  storeError?: RateLimitStoreErrorPolicy;
  /** Set when the request waited for room (a rule with `wait`): for how long, in ms. */
  waitedMs?: number;
  /** Set when a ban refused the request (`RateLimitManagementService.ban`); `reported.resetMs` says until when. */
  banned?: true;
  /** With `banned`: the rule the ban is on, `'*'` for every rule (the request's own rules then say nothing of it). */
  bannedUnder?: string;
}

/** Units a rule with `settleCost` reserved for a request (its `cost`), until its real cost is known. */
export interface ReservedUnits {
  rule: RateLimitRule;
  refund: RateLimitRefund;
}

/**
 * Units that stay counted only if the response ends as `countOn` says; a cap's slot (`'release'`)
 * is given back however it ends.
 */
export interface ConditionalUnits {
  rule: RateLimitRule;
  countOn: 'success' | 'failure' | 'release';
  /** What the store takes back; a cap's slot's receipt moves as it is renewed. */
  refund: RateLimitRefund;
}

/** Picks the decision the headers report: the rejecting rule with the longest wait, else the one `reportsBefore` the others. */
export function rateLimitOutcome(
  decisions: readonly RuleDecision[],
  allowed: boolean,
  conditional: readonly ConditionalUnits[],
  storeError?: RateLimitStoreErrorPolicy,
  reserved: readonly ReservedUnits[] = NO_RESERVED_UNITS,
): RateLimitOutcome {
  let reported: RuleDecision | undefined;
  for (const decision of decisions) {
    if ((decision.fallback && allowed) || decision.mode === 'shadow') continue;
    if (!allowed) {
      if (!decision.allowed && (!reported || decision.resetMs > reported.resetMs)) reported = decision;
    } else if (!reported || reportsBefore(decision, reported)) {
      reported = decision;
    }
  }
  const outcome: RateLimitOutcome = { decisions, reported, allowed, conditional, reserved };
  if (storeError) outcome.storeError = storeError;
  return outcome;
}

/**
 * A request decided in two parts, before the app's guards and after them (each part one store
 * call): one outcome whose headers report a rule of either, picked as for one part. Only the
 * second part's units are left to settle: the first part's were armed when it was decided.
 */
export function bothParts(first: RateLimitOutcome, second: RateLimitOutcome): RateLimitOutcome {
  if (second.banned || first.decisions.length === 0) return second;
  const decisions = [...first.decisions, ...second.decisions];
  return rateLimitOutcome(decisions, second.allowed, second.conditional, second.storeError, second.reserved);
}

/** The outcome of a store call: each rule's decision, in the order of the rules prepared. */
export function decidedOutcome(prepared: readonly PreparedRule[], consumption: ResilientConsumption): RateLimitOutcome {
  const fallback = consumption.storeError !== undefined;
  const decisions: RuleDecision[] = [];
  for (let i = 0; i < prepared.length; i += 1) {
    const { rule, identity, thresholds, hit } = prepared[i];
    // Field by field, not spread: decisions of several shapes made the spread a slow path.
    const { allowed, limit, remaining, resetMs, provisional } = consumption.decisions[i];
    const decision: RuleDecision = {
      allowed,
      limit,
      remaining,
      resetMs,
      rule,
      identity,
      windowMs: thresholds.windowMs,
      cost: hit.cost,
      fallback,
      mode: thresholds.mode,
    };
    if (provisional) decision.provisional = true;
    decisions.push(decision);
  }
  return rateLimitOutcome(
    decisions,
    consumption.allowed,
    NO_CONDITIONAL_UNITS,
    consumption.storeError,
    NO_RESERVED_UNITS,
  );
}

/** The `conditional` of nearly every outcome: no rule with `countOn`. */
const NO_CONDITIONAL_UNITS = Object.freeze([]) as unknown as ConditionalUnits[];

/** The `reserved` of nearly every outcome: no rule with `settleCost`. */
export const NO_RESERVED_UNITS: readonly ReservedUnits[] = Object.freeze([]);

/**
 * Of two rules that admitted a request, whether `a` is the one its headers report rather than `b`.
 * A `settleCost` rule's budget comes before counts of requests: such a request spends its units (an
 * LLM call's tokens), which the client meters itself against, and a default beside it (300 requests
 * a minute per address) would otherwise always look tighter by its smaller numbers. A rule with
 * nothing left comes first all the same: it refuses the next request, and the headers say so.
 */
function reportsBefore(a: RuleDecision, b: RuleDecision): boolean {
  const rankA = reportRank(a);
  const rankB = reportRank(b);
  return rankA < rankB || (rankA === rankB && tighter(a, b));
}

function reportRank(decision: RuleDecision): number {
  if (decision.remaining === 0) return 0;
  return decision.rule.settleCost === undefined ? 2 : 1;
}

function tighter(a: RuleDecision, b: RuleDecision): boolean {
  return a.remaining < b.remaining || (a.remaining === b.remaining && a.resetMs > b.resetMs);
}

/** Whole seconds until a rejected request would be admitted; at least 1. */
export function retryAfterSeconds(decision: RateLimitDecision): number {
  return Math.max(1, Math.ceil(decision.resetMs / 1000));
}

/**
 * Which rate-limit headers responses carry:
 * - `'draft-6'` (default): `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of the
 *   tightest rule, as draft-ietf-httpapi-ratelimit-headers-06 and earlier name them, and as most
 *   clients read them today;
 * - `'draft-11'`: the current draft's structured fields, one item per rule, named after it:
 *   `RateLimit-Policy: "orders";q=100;w=60, "user";q=5;w=1` and
 *   `RateLimit: "orders";r=97;t=42, "user";r=4;t=1`;
 * - `'x-ratelimit'`: `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` of the
 *   tightest rule, the names `@nestjs/throttler` sends, for clients migrating from it;
 * - `false`: none.
 * Whatever the style, a rejected request carries `Retry-After`.
 */
export type RateLimitHeaderStyle = 'draft-6' | 'draft-11' | 'x-ratelimit' | false;
export const HEADER_STYLES: readonly RateLimitHeaderStyle[] = ['draft-6', 'draft-11', 'x-ratelimit', false];

/** The names of the styles that report the tightest rule: limit, remaining, reset. */
const TIGHTEST_RULE_NAMES = {
  'draft-6': ['RateLimit-Limit', 'RateLimit-Remaining', 'RateLimit-Reset'],
  'x-ratelimit': ['X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset'],
} as const;

/**
 * The headers of a request the store decided, in `style`, as names and values in turn (one array
 * per response, not one per header); a rejection's `Retry-After` last.
 */
export function rateLimitHeaders(outcome: RateLimitOutcome, style: RateLimitHeaderStyle): string[] {
  const reported = outcome.reported!;
  let headers: string[];
  if (style === 'draft-6' || style === 'x-ratelimit') {
    const [limit, remaining, reset] = TIGHTEST_RULE_NAMES[style];
    headers = [
      limit,
      String(reported.limit),
      remaining,
      String(reported.remaining),
      reset,
      String(resetSeconds(reported)),
    ];
  } else if (style === 'draft-11') {
    // Rule names are letters, digits and `. _ $ -`: valid sf-strings as they are.
    const decided = outcome.decisions.filter((decision) => !decision.fallback && decision.mode !== 'shadow');
    headers = [
      'RateLimit-Policy',
      decided.map((d) => `"${d.rule.name}";q=${d.limit};w=${Math.ceil(d.windowMs / 1000)}`).join(', '),
      'RateLimit',
      decided
        .map((d) => `"${d.rule.name}";r=${remainingAfter(d, outcome.allowed, d.cost)};t=${resetSeconds(d)}`)
        .join(', '),
    ];
  } else {
    headers = [];
  }
  if (!outcome.allowed) headers.push('Retry-After', String(retryAfterSeconds(reported)));
  return headers;
}

/** Seconds until the full limit is available again, rounded up. */
function resetSeconds(decision: RuleDecision): number {
  return Math.max(0, Math.ceil(decision.resetMs / 1000));
}

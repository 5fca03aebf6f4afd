import type { ExecutionContext } from '@nestjs/common';
import type { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { RateLimitOutcome, RuleDecision } from '../limiter/rate-limit-outcome.js';

/** What a request really cost, as `report` and `settle` take it. */
type RateLimitCostReport = Parameters<RateLimitRequestDecision['report']>[0];

/**
 * A request's decision as its handler is given it, on `req.rateLimit`, when the handler has a
 * `settleCost` rule: the figures of the decision, and a say in what the request is settled at.
 * Made for handlers whose result is not their cost: an `@Sse()` stream of an LLM answer, a
 * response piped with `@Res()`.
 *
 * @example
 * ```ts
 * @Sse('chat')
 * // Unless the handler reports, a stream is settled at its most.
 * @RateLimit({ count: 10_000, window: '1m', cost: 200, settleCost: { actual: () => 2_000, max: 2_000 } })
 * chat(@Req() req: { rateLimit: RateLimitRequestDecision }): Observable<MessageEvent> {
 *   let tokens = 0;
 *   return llm.stream(prompt).pipe(
 *     tap((chunk) => req.rateLimit.report((tokens += chunk.tokens))), // settled when the stream ends
 *     map((chunk) => ({ data: chunk.text })),
 *   );
 * }
 * ```
 */
export interface RateLimitRequestDecision {
  /** The tightest rule's limit; undefined when Redis was out and a store-error policy decided. */
  readonly limit: number | undefined;
  /** Units the tightest rule has left after this request's reservation; undefined as `limit`. */
  readonly remaining: number | undefined;
  /** Ms until the tightest rule's full limit is available again; undefined as `limit`. */
  readonly resetMs: number | undefined;
  /** Each rule's decision for this request. */
  readonly decisions: readonly RuleDecision[];
  /**
   * What the request has cost so far: settled when it ends (its stream completes or fails, its
   * client leaves, its response ends), in place of the rule's `settleCost.actual` of the result. A
   * later report replaces an earlier one. A whole number >= 0 for each of its `settleCost` rules,
   * or one per rule name.
   */
  report(cost: number | Readonly<Record<string, number>>): void;
  /**
   * Settles now, at `cost` (default: the last report, else the reservation); the request's end then
   * settles nothing. Only the first settlement counts. Never rejects.
   */
  settle(cost?: number | Readonly<Record<string, number>>): Promise<void>;
}

/**
 * One request's settlement of its `settleCost` rules: by the handler (`report`, `settle`), else
 * once the request has ended (`ended`), by each rule's `settleCost` of the result, or the
 * reservation when the handler failed or never finished.
 */
export class RequestCostSettlement implements RateLimitRequestDecision {
  private reported: RateLimitCostReport | undefined;
  private settled: Promise<void> | undefined;

  constructor(
    private readonly outcome: RateLimitOutcome,
    private readonly limiter: RateLimiterService,
    private readonly context: ExecutionContext,
  ) {}

  get limit(): number | undefined {
    return this.outcome.reported?.limit;
  }

  get remaining(): number | undefined {
    return this.outcome.reported?.remaining;
  }

  get resetMs(): number | undefined {
    return this.outcome.reported?.resetMs;
  }

  get decisions(): readonly RuleDecision[] {
    return this.outcome.decisions;
  }

  report(cost: RateLimitCostReport): void {
    this.reported = cost;
  }

  settle(cost?: RateLimitCostReport): Promise<void> {
    if (cost !== undefined && !this.settled) this.reported = cost;
    return (this.settled ??= this.limiter.settleCost(this.outcome, this.reported ?? this.reservation()));
  }

  /**
   * The request has ended: `done` its handler's result, none when the handler failed or was left
   * before its end. What the handler reported comes first.
   */
  ended(done: { result: unknown } | undefined): Promise<void> {
    if (this.settled || this.reported !== undefined || !done) return this.settle();
    this.settled = this.costOf(done.result).then((actual) => this.limiter.settleCost(this.outcome, actual));
    return this.settled;
  }

  /** What each rule reserved: kept. */
  private reservation(): Record<string, number> {
    const kept: Record<string, number> = {};
    for (const { rule, refund } of this.outcome.reserved) kept[rule.name] = refund.hit.cost;
    return kept;
  }

  /** Each rule's `settleCost` of the result. */
  private async costOf(result: unknown): Promise<Record<string, number>> {
    const actual: Record<string, number> = {};
    for (const { rule } of this.outcome.reserved) {
      try {
        actual[rule.name] = await rule.settleCost!(result, this.context);
      } catch {
        // Kept as reserved; the limiter says an invalid cost once, and this is one.
        actual[rule.name] = Number.NaN;
      }
    }
    return actual;
  }
}

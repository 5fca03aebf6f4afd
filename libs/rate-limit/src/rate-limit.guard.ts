import { type CanActivate, type ExecutionContext, Injectable } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import {
  type RuleDecision,
  attachOutcome,
  outcomeOf,
  rateLimitHeaders,
  retryAfterSeconds,
} from './rate-limit-outcome.js';
import { RateLimitException } from './rate-limit.exception.js';
import { RateLimiterService } from './rate-limiter.service.js';
import { RateLimitRuleRegistry } from './rules/rate-limit-rule.registry.js';

/**
 * Decides each request before pipes and the handler run: rules from `@RateLimit` metadata (compiled
 * at bootstrap), one decision per rule, and on rejection a `RateLimitException` (429) with
 * `Retry-After` and `RateLimit-*` headers set. A request is counted once even when the guard is
 * registered both globally and with `@UseGuards`.
 *
 * Subclass it and override `createException` to change the error.
 */
@Injectable()
export class RateLimitGuard implements CanActivate {
  constructor(
    private readonly registry: RateLimitRuleRegistry,
    private readonly limiter: RateLimiterService,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    if (context.getType() !== 'http') return true;
    const rules = this.registry.rulesFor(context.getClass(), context.getHandler());
    if (rules.length === 0) return true;
    const http = context.switchToHttp();
    const request = http.getRequest<object>();
    const earlier = outcomeOf(request);
    if (earlier) return earlier.allowed;

    const outcome = await this.limiter.check(rules, context);
    attachOutcome(request, outcome);
    if (outcome.allowed) return true;

    const rejected = outcome.reported!;
    const response = http.getResponse<object>();
    const { httpAdapter } = this.adapterHost;
    const headers = rejected.fallback
      ? [['Retry-After', String(retryAfterSeconds(rejected))]]
      : rateLimitHeaders(rejected);
    for (const [name, value] of headers) httpAdapter.setHeader(response, name, value);
    throw this.createException(rejected, context);
  }

  /** The error thrown for a rejected request. Its headers are already on the response. */
  protected createException(rejected: RuleDecision, _context: ExecutionContext): Error {
    return new RateLimitException(retryAfterSeconds(rejected), rejected.rule.name);
  }
}

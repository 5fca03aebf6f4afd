import { type CallHandler, type ExecutionContext, Inject, Injectable, type NestInterceptor } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { rateLimitHeaders } from './rate-limit-headers.js';
import { outcomeOf } from './request-outcome.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';

/**
 * Wraps handlers of admitted requests: sets the rate-limit headers (the module's `headers` style;
 * by default `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` of the tightest rule)
 * before the handler writes its response.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  /** @internal Nest creates it; a subclass declares no constructor of its own. */
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() === 'http') {
      const http = context.switchToHttp();
      const outcome = outcomeOf(http.getRequest<object>());
      const reported = outcome?.reported;
      if (outcome && reported && reported.allowed && !reported.fallback) {
        const response = http.getResponse<object>();
        for (const [name, value] of rateLimitHeaders(outcome, this.options.headers)) {
          this.adapterHost.httpAdapter.setHeader(response, name, value);
        }
      }
    }
    return next.handle();
  }
}

import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { outcomeOf, rateLimitHeaders } from './rate-limit-outcome.js';

/**
 * Wraps handlers of admitted requests: sets `RateLimit-Limit`, `RateLimit-Remaining` and
 * `RateLimit-Reset` (seconds) from the tightest rule before the handler writes its response.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() === 'http') {
      const http = context.switchToHttp();
      const reported = outcomeOf(http.getRequest<object>())?.reported;
      if (reported && reported.allowed && !reported.fallback) {
        const response = http.getResponse<object>();
        for (const [name, value] of rateLimitHeaders(reported)) {
          this.adapterHost.httpAdapter.setHeader(response, name, value);
        }
      }
    }
    return next.handle();
  }
}

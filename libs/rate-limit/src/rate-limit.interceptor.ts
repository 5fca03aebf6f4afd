import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import type { Observable } from 'rxjs';
import { outcomeOf, rateLimitHeaders } from './rate-limit-outcome.js';
import { RateLimiterService } from './rate-limiter.service.js';

/**
 * Wraps handlers of admitted requests: sets `RateLimit-Limit`, `RateLimit-Remaining` and
 * `RateLimit-Reset` (seconds) from the tightest rule before the handler writes its response, and
 * when the response ends, refunds the units of rules whose `countOn` it did not meet.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly limiter: RateLimiterService,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    if (context.getType() !== 'http') return next.handle();
    const http = context.switchToHttp();
    const outcome = outcomeOf(http.getRequest<object>());
    if (!outcome?.allowed) return next.handle();
    const response = http.getResponse<object>();
    const { reported } = outcome;
    if (reported && !reported.fallback) {
      for (const [name, value] of rateLimitHeaders(reported)) {
        this.adapterHost.httpAdapter.setHeader(response, name, value);
      }
    }
    if (outcome.conditional.length > 0) {
      // Express hands us the Node response; Fastify a reply wrapping it as `raw`.
      const raw = ((response as { raw?: ServerResponse }).raw ?? response) as ServerResponse;
      let settled = false;
      const settle = (succeeded: boolean) => {
        if (settled) return;
        settled = true;
        void this.limiter.settle(outcome, succeeded);
      };
      raw.once('finish', () => settle(raw.statusCode < 400));
      // Closed before it finished: the client went away or the response stream failed.
      raw.once('close', () => settle(false));
    }
    return next.handle();
  }
}

import { type CallHandler, Injectable, type NestInterceptor } from '@nestjs/common';
import type { Observable } from 'rxjs';

/**
 * @deprecated Does nothing since 0.3: `RateLimitGuard` sets the headers of admitted requests
 * itself. Kept so that `@UseInterceptors(RateLimitInterceptor)` still compiles; remove it from
 * your routes (it costs each of them Nest's interceptor pipeline). Removed in 1.0.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  intercept(_context: unknown, next: CallHandler): Observable<unknown> {
    return next.handle();
  }
}

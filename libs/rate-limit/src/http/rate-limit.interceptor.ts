import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { Observable } from 'rxjs';
import { RateLimitGuard, guardDeferredTo } from './rate-limit.guard.js';
import { invocationOf } from '../transports/limited-context.js';

/**
 * Decides the rules that must wait for the app's own guards: those whose `by` is a function of the
 * request, which typically reads what an authentication guard set (`req.user`). Nest runs global
 * guards (`RateLimitGuard` among them) before a controller's `@UseGuards(AuthGuard)`, so deciding
 * such a rule there would count every user under one anonymous identity, and answer 429 where the
 * auth guard would answer 401. An interceptor runs after every guard and before pipes and the
 * handler: the request is decided here instead, in the same single store call, with the same
 * headers and errors.
 *
 * `@RateLimit` adds it to the handlers (or controllers) whose rules need it; other routes never run
 * it, so they pay nothing for Nest's interceptor pipeline. It decides with the `RateLimitGuard`
 * that passed the request on (a subclass's `createException` included), or with the module's.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  private moduleGuard: RateLimitGuard | undefined;

  /**
   * Only `ModuleRef`, which every module can inject: `@UseInterceptors` instantiates the
   * interceptor in the module of the controller, which need not import `RateLimitModule`.
   * @internal
   */
  constructor(private readonly moduleRef: ModuleRef) {}

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const guard = guardDeferredTo(invocationOf(context)) ?? this.guardOfModule();
    await guard.decideAfterGuards(context);
    return next.handle();
  }

  private guardOfModule(): RateLimitGuard {
    this.moduleGuard ??= this.moduleRef.get(RateLimitGuard, { strict: false });
    if (!this.moduleGuard) {
      throw new Error('RateLimitInterceptor needs RateLimitModule: import RateLimitModule.forRoot() in the app');
    }
    return this.moduleGuard;
  }
}

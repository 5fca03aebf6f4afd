import { type CallHandler, type ExecutionContext, Injectable, type NestInterceptor } from '@nestjs/common';
import { ModuleRef } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import { type Observable, finalize, tap } from 'rxjs';
import { guardDeferredTo, outcomeOf } from './rate-limit.guard.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import type { RateLimitOutcome } from '../limiter/rate-limit-outcome.js';
import { type RateLimitRequestDecision, RequestCostSettlement } from './request-cost-settlement.js';
import { invocationOf, transportOf } from '../transports/limited-context.js';

/** Outcomes an interceptor settles, so that a second one on the same call does not settle again. */
const SETTLED_HERE = new WeakSet<RateLimitOutcome>();

/**
 * Decides the rules that must wait for the app's own guards: those whose `by` is a function of the
 * request, which typically reads what an authentication guard set (`req.user`). Nest runs global
 * guards (`RateLimitGuard` among them) before a controller's `@UseGuards(AuthGuard)`, so deciding
 * such a rule there would count every user under one anonymous identity, and answer 429 where the
 * auth guard would answer 401. An interceptor runs after every guard and before pipes and the
 * handler: the request is decided here instead, in the same single store call, with the same
 * headers and errors.
 *
 * It also settles what only the handler's outcome tells: `countOn` units of a GraphQL operation or
 * a WebSocket message (an HTTP route's are settled by its response's status), and the real cost of
 * a `settleCost` rule's request, of the handler's result. Rules with either are decided here too,
 * after the app's guards, so a request a guard refuses holds nothing that would wait for a
 * settlement that never comes.
 *
 * `@RateLimit` adds it to the handlers (or controllers) whose rules need it; other routes never run
 * it, so they pay nothing for Nest's interceptor pipeline. It decides with the `RateLimitGuard`
 * that passed the request on (a subclass's `createException` included), and nothing where no
 * such guard ran. A handler's rules by client address or for all are decided by that guard, before
 * the app's guards, whatever its other rules need.
 */
@Injectable()
export class RateLimitInterceptor implements NestInterceptor {
  private limiter: RateLimiterService | undefined;

  /**
   * Only `ModuleRef`, which every module can inject: `@UseInterceptors` instantiates the
   * interceptor in the module of the controller, which need not import `RateLimitModule`.
   * @internal
   */
  constructor(private readonly moduleRef: ModuleRef) {}

  async intercept(context: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const invocation = invocationOf(context);
    // Only what a `RateLimitGuard` passed on: a route that guard does not cover (`globalGuard:
    // false` without `@UseGuards(RateLimitGuard)`) is not limited, whatever its rules need.
    const guard = guardDeferredTo(invocation);
    if (!guard) return next.handle();
    await guard.decideAfterGuards(context);
    const outcome = outcomeOf(invocation);
    if (!outcome?.allowed) return next.handle();
    // HTTP: the guard settles `countOn` units when the response ends, by its status.
    const countOn = outcome.conditional.length > 0 && transportOf(context) !== 'http';
    const costs = outcome.reserved.length > 0;
    // The interceptor may run twice for one call (on the class and the handler, or app-wide and
    // on the route): only the first settles.
    if ((!countOn && !costs) || SETTLED_HERE.has(outcome)) return next.handle();
    SETTLED_HERE.add(outcome);
    return this.settledByHandler(outcome, next.handle(), context, countOn, costs);
  }

  /**
   * Settles what only the handler's outcome tells. `countOn` units of a GraphQL operation or a
   * WebSocket message: done (its result out) is a success; an error, or an end before the result
   * (the client went, the stream was dropped), a failure. `settleCost` rules: what the handler
   * reported (`req.rateLimit`), else their real cost of the handler's result; a handler that fails
   * (or never ends) keeps the reservation, settled all the same to end its claim in flight. Over
   * HTTP, once the response has ended too: a stream (`@Sse()`, or piped with `@Res()`) is settled
   * when it ends, fails or its client leaves, not at the handler's return.
   */
  private settledByHandler(
    outcome: RateLimitOutcome,
    handled: Observable<unknown>,
    context: ExecutionContext,
    countOn: boolean,
    costs: boolean,
  ): Observable<unknown> {
    this.limiter ??= this.moduleRef.get(RateLimiterService, { strict: false });
    const limiter = this.limiter!;
    let settled = !countOn;
    const settlement = costs ? new RequestCostSettlement(outcome, limiter, context) : undefined;
    const http = transportOf(context) === 'http';
    // The handler's own say in it: `req.rateLimit`.
    if (settlement && http) (invocationOf(context) as { rateLimit?: RateLimitRequestDecision }).rateLimit = settlement;
    const costsSettled = settlement && (http ? whenResponseEnds(context) : undefined);
    let ended = false;
    /** @param done the handler's result; none when it failed or never ended. */
    const settle = (done?: { result: unknown }) => {
      if (!settled) {
        settled = true;
        void limiter.settle(outcome, done !== undefined);
      }
      if (settlement && !ended) {
        ended = true;
        if (costsSettled) void costsSettled.then(() => settlement.ended(done));
        else void settlement.ended(done);
      }
    };
    let result: unknown;
    return handled.pipe(
      tap({
        next: (value) => (result = value),
        complete: () => settle({ result }),
        error: () => settle(),
      }),
      finalize(() => settle()),
    );
  }
}

/** Resolves once the HTTP response has been sent, or closed before (its client left, its stream failed). */
function whenResponseEnds(context: ExecutionContext): Promise<void> {
  // Express hands us the Node response; Fastify a reply wrapping it as `raw`.
  const response = context.getArgByIndex<{ raw?: ServerResponse } & ServerResponse>(1);
  const raw = response.raw ?? response;
  if (raw.writableFinished || raw.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      raw.off('finish', done);
      raw.off('close', done);
      resolve();
    };
    raw.once('finish', done);
    raw.once('close', done);
  });
}

import {
  type CanActivate,
  type ExecutionContext,
  Inject,
  Injectable,
  type OnApplicationBootstrap,
  ServiceUnavailableException,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import type { ServerResponse } from 'node:http';
import { RateLimitBannedException, RateLimitException, banMessage, withoutStack } from './rate-limit.exception.js';
import {
  bothParts,
  type RateLimitOutcome,
  type RuleDecision,
  rateLimitHeaders,
  retryAfterSeconds,
} from '../limiter/rate-limit-outcome.js';
import { endEventStreamWhenClientLeaves } from './event-stream-client-exit.js';
import { settleWhenResponseEnds } from './settle-when-response-ends.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { RateLimitConfigurationError, type RateLimitRule } from '../rules/rate-limit-rule.js';
import { SUPPORTED_HANDLERS } from '../rules/handler-kinds.js';
import { type GuardSplit, RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitGraphQLError, loadWsRejection } from '../transports/rate-limit-rejections.js';
import {
  ContextRequest,
  UntrustedProxyCheck,
  answerHalfClosedClients,
  headersSent,
  invocationOf,
  transportOf,
} from '../transports/limited-context.js';

/**
 * The guard's decision per request, so a guard registered twice (globally and with `@UseGuards`)
 * decides once; once the rules waiting for the app's guards are decided too, both parts' outcome.
 * On the request, under a symbol of the library's: kept in a WeakMap instead, an entry per request
 * cost every young-generation collection its weak-table work (the guard path's collections took
 * 1.5x as long, its p99 1.6x, at 16 in flight).
 */
const OUTCOME = Symbol('nest-rate-limit outcome');
/** Per request: the guard that left rules to `RateLimitInterceptor`; their outcome (decided once). */
const DEFERRED = Symbol('nest-rate-limit deferred');
const AFTER_GUARDS = Symbol('nest-rate-limit after guards');

type Invocation = { [OUTCOME]?: RateLimitOutcome; [DEFERRED]?: AfterGuardsDecider; [AFTER_GUARDS]?: RateLimitOutcome };
export function outcomeOf(request: object): RateLimitOutcome | undefined {
  return (request as Invocation)[OUTCOME];
}

/** What decides a request's rules once the app's guards have run: the guard that passed it on. */
export interface AfterGuardsDecider {
  /** Resolves when admitted (or nothing to decide); throws the rejection otherwise. */
  decideAfterGuards(context: ExecutionContext): Promise<boolean>;
}

export function guardDeferredTo(request: object): AfterGuardsDecider | undefined {
  return (request as Invocation)[DEFERRED];
}

/**
 * Decides each request before pipes and the handler run: rules from `@RateLimit` metadata (compiled
 * at bootstrap), all decided in one store call, and on rejection a `RateLimitException` (429) with
 * `Retry-After` and `RateLimit-*` headers set. A request is counted once even when the guard is
 * registered both globally and with `@UseGuards`. Units of `countOn` rules are refunded when the
 * response ends as the rule does not count.
 *
 * Admitted requests get their `RateLimit-*` headers here too, before the handler writes its
 * response: a global interceptor would add Nest's observable pipeline to every route (about 6% of
 * a small app's requests per second, `npm run bench:http`).
 *
 * A rule decided after the app's guards (`RateLimitRule.afterGuards`: its `by` reads `req.user`)
 * is left to `RateLimitInterceptor`; the handler's other rules are still decided here, so the
 * requests an authentication guard refuses are counted by them.
 *
 * Subclass it and override `createException` to change the error.
 */
@Injectable()
export class RateLimitGuard implements CanActivate, OnApplicationBootstrap {
  /** Says once when requests come through a proxy the app does not trust. */
  private readonly untrustedProxy = new UntrustedProxyCheck();
  /** Per rule, the last 429 made (`createException`). */
  private readonly lastRefusals = new WeakMap<RateLimitRule, RateLimitException>();
  /** Per controller and handler, its rules for HTTP requests and for the others (`rulesOf`). */
  private readonly handlers = new WeakMap<object, Map<object, { http?: HandlerRules; other?: HandlerRules }>>();

  /** @internal Nest creates it; a subclass declares no constructor of its own. */
  constructor(
    private readonly registry: RateLimitRuleRegistry,
    private readonly limiter: RateLimiterService,
    private readonly adapterHost: HttpAdapterHost,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
  ) {}

  /**
   * Has the app's HTTP server answer clients that half-close their connection after the request:
   * Node's default ends such a connection at once, so an answer decided after a Redis call never
   * left, and a `countOn` rule counted the request as one that never finished.
   */
  onApplicationBootstrap(): void {
    answerHalfClosedClients(this.adapterHost.httpAdapter?.getHttpServer());
  }

  canActivate(context: ExecutionContext): Promise<boolean> {
    try {
      const { rules, split, eventStream } = this.rulesOf(context);
      if (rules.length === 0) return ADMITTED;
      if (!split) return this.decide(rules, context, eventStream);
      (invocationOf(context) as Invocation)[DEFERRED] = this;
      if (split.beforeGuards.length === 0) return ADMITTED;
      return this.decide(split.beforeGuards, context, eventStream);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  decideAfterGuards(context: ExecutionContext): Promise<boolean> {
    try {
      const { split, eventStream } = this.rulesOf(context);
      if (!split) return ADMITTED;
      return this.decide(split.afterGuards, context, eventStream, AFTER_GUARDS);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** A handler's rules as the registry compiled them, for this kind of request: asked once per handler. */
  private rulesOf(context: ExecutionContext): HandlerRules {
    const controller = context.getClass();
    const handler = context.getHandler();
    const http = context.getType() === 'http';
    let byHandler = this.handlers.get(controller);
    if (!byHandler) this.handlers.set(controller, (byHandler = new Map()));
    const known = byHandler.get(handler);
    const found = known && (http ? known.http : known.other);
    if (found) return found;
    const rules = this.registry.rulesFor(controller, handler);
    const kind: HandlerRules = {
      rules,
      split: this.registry.splitAroundGuards(rules, http),
      eventStream: this.registry.isEventStream(handler),
    };
    byHandler.set(handler, { ...known, [http ? 'http' : 'other']: kind });
    return kind;
  }

  private decide(
    rules: readonly RateLimitRule[],
    context: ExecutionContext,
    /** Whether the handler is an `@Sse()` route (`HandlerRules.eventStream`). */
    eventStream: boolean,
    part: typeof OUTCOME | typeof AFTER_GUARDS = OUTCOME,
  ): Promise<boolean> {
    const transport = transportOf(context);
    // Bootstrap refuses rules on such handlers; should one get past it, it must not pass unlimited.
    if (!transport) {
      const handler = `${context.getClass().name}.${context.getHandler().name}`;
      throw new RateLimitConfigurationError(
        `@RateLimit on ${handler}: it runs in a '${context.getType()}' context, and ${SUPPORTED_HANDLERS}`,
      );
    }
    const invocation = invocationOf(context) as Invocation;
    const earlier = invocation[part];
    if (earlier) return Promise.resolve(earlier.allowed);
    if (transport !== 'ws') this.untrustedProxy.check(context);
    return this.limiter.check(rules, new ContextRequest(context)).then((decided) => {
      const before = part === AFTER_GUARDS ? invocation[OUTCOME] : undefined;
      const outcome = before ? bothParts(before, decided) : decided;
      // Kept for what runs after this guard; a refused request goes no further (Nest stops at a
      // guard's error), and a property added to Node's request costs ~3 µs in an app under attack.
      if (outcome.allowed) {
        invocation[part] = decided;
        invocation[OUTCOME] = outcome;
      }
      if (transport === 'http') return this.answerHttp(outcome, context, eventStream);
      return this.answerOther(outcome, context, transport);
    });
  }

  /** A GraphQL operation or a WebSocket message. */
  private answerOther(
    outcome: RateLimitOutcome,
    context: ExecutionContext,
    transport: 'graphql' | 'ws',
  ): boolean | Promise<boolean> {
    if (outcome.allowed) return true;
    const rejected = outcome.reported!;
    if (outcome.banned && transport === 'graphql') {
      this.setRetryAfter(context, rejected);
      const retryAfter = retryAfterSeconds(rejected);
      throw withoutStack(() => {
        const rule = outcome.bannedUnder ?? rejected.rule.name;
        return new RateLimitGraphQLError(retryAfter, rule, banMessage(rule, retryAfter));
      });
    }
    if (transport === 'ws') {
      return loadWsRejection().then((reject) => {
        const message = context.switchToWs();
        const refused = { pattern: message.getPattern(), data: message.getData<unknown>() };
        throw withoutStack(() => reject(retryAfterSeconds(rejected), rejected.rule.name, refused));
      });
    }
    this.setRetryAfter(context, rejected);
    throw withoutStack(() => this.createException(rejected, context));
  }

  private answerHttp(outcome: RateLimitOutcome, context: ExecutionContext, eventStream: boolean): boolean {
    // The response, read as `switchToHttp().getResponse()` does without the three functions that
    // call adds to the context each time.
    const response = context.getArgByIndex<object>(1);
    const { reported } = outcome;
    if (outcome.banned) {
      const retryAfter = retryAfterSeconds(reported!);
      if (!headersSent(response)) this.adapterHost.httpAdapter.setHeader(response, 'Retry-After', String(retryAfter));
      const rule = outcome.bannedUnder ?? reported!.rule.name;
      throw withoutStack(() => new RateLimitBannedException(retryAfter, rule, this.options.bans.status));
    }
    // None is reported when the fallback admitted on every rule (Redis out), and a refusal the
    // fallback decided has no figures worth sending: only when to retry.
    // Not once the head is out: an `@Sse()` route writes its head on the next turn of the event
    // loop, before a decision after the app's guards (`RateLimitInterceptor`) has come back from
    // the store, and setting a header then throws (Express) or is never sent (Fastify).
    if (reported && !headersSent(response)) {
      const headers = reported.fallback
        ? ['Retry-After', String(retryAfterSeconds(reported))]
        : rateLimitHeaders(outcome, this.options.headers);
      // Express's response is Node's: set there, past the adapter's and Express's `set` (about 0.4 µs
      // a header); a Fastify reply has no `setHeader`.
      const node = (response as Partial<ServerResponse>).setHeader ? (response as ServerResponse) : undefined;
      const { httpAdapter } = this.adapterHost;
      for (let i = 0; i < headers.length; i += 2) {
        if (node) node.setHeader(headers[i], headers[i + 1]);
        else httpAdapter.setHeader(response, headers[i], headers[i + 1]);
      }
    }
    // The time waited for room (`wait`), where browsers' tools and tracing read a server's timings.
    if (outcome.waitedMs !== undefined && !headersSent(response)) {
      this.adapterHost.httpAdapter.appendHeader(response, 'Server-Timing', `rate-limit-wait;dur=${outcome.waitedMs}`);
    }
    if (outcome.allowed) {
      if (outcome.conditional.length > 0) settleWhenResponseEnds(outcome, response, this.limiter);
      if (eventStream) endEventStreamWhenClientLeaves(context);
      return true;
    }

    const rejected = reported!;
    if (outcome.storeError === 'deny' && this.options.storeErrors.status === 503) {
      throw withoutStack(
        () =>
          new ServiceUnavailableException({
            statusCode: 503,
            error: 'Service Unavailable',
            message: 'Rate limiting is unavailable; retry shortly',
            retryAfter: retryAfterSeconds(rejected),
          }),
      );
    }
    throw withoutStack(() => this.createException(rejected, context));
  }

  /** A GraphQL operation over HTTP: its response says when to retry, as a 429 would. */
  private setRetryAfter(context: ExecutionContext, rejected: RuleDecision): void {
    const gql = context.getArgByIndex<{ res?: object; reply?: object; req?: { res?: object } } | undefined>(2);
    // Express hangs the response on its request, which is what the drivers' default context holds.
    const response = gql?.res ?? gql?.reply ?? gql?.req?.res;
    // A failed non-null field can end the operation early, and a header set after its answer throws.
    if (response && !headersSent(response)) {
      this.adapterHost.httpAdapter.setHeader(response, 'Retry-After', String(retryAfterSeconds(rejected)));
    }
  }

  /**
   * The error thrown for a rejected request, made without a stack trace: a `RateLimitException`
   * (429; its headers are already on the response) for HTTP, a `RateLimitGraphQLError` (extensions
   * `{ code: 'RATE_LIMITED', retryAfter, rule }`) for GraphQL. A WebSocket message gets a
   * `WsException` whose body is a `RateLimitWsError`, made elsewhere (it needs `@nestjs/websockets`).
   */
  protected createException(rejected: RuleDecision, context: ExecutionContext): Error {
    const retryAfter = retryAfterSeconds(rejected);
    if (context.getType<string>() === 'graphql') return new RateLimitGraphQLError(retryAfter, rejected.rule.name);
    // The refusals of one rule in one second are alike (an attack's): one exception, which Nest only reads.
    const last = this.lastRefusals.get(rejected.rule);
    if (last?.retryAfterSeconds === retryAfter) return last;
    const exception = new RateLimitException(retryAfter, rejected.rule.name);
    this.lastRefusals.set(rejected.rule, exception);
    return exception;
  }
}

/** A handler's rules, which wait for the app's guards (none for default rules), whether it is `@Sse()`. */
interface HandlerRules {
  rules: readonly RateLimitRule[];
  split: GuardSplit | undefined;
  eventStream: boolean;
}

/** What the guard answers a request it admits without deciding anything: one promise for all of them. */
const ADMITTED = Promise.resolve(true);

import {
  type ExecutionContext,
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { RateLimitConfigCentre } from './config-centre/rate-limit-config-centre.js';
import { RuleThresholds, type Thresholds } from './config-centre/rule-thresholds.js';
import { SampledLogger } from './logging/sampled-logger.js';
import type { RateLimitOutcome, RuleDecision } from './rate-limit-outcome.js';
import { rateLimitKey } from './rate-limit-key.js';
import { DEFAULT_LOG_MAX_TRACKED } from './rate-limit.constants.js';
import { RATE_LIMIT_OPTIONS } from './rate-limit.module-definition.js';
import {
  type RateLimitModuleOptions,
  type ResolvedRateLimitOptions,
  resolveModuleOptions,
} from './rate-limit.options.js';
import type { RateLimitRule } from './rules/rate-limit-rule.js';
import { RateLimitStore } from './stores/rate-limit-store.js';

/** Retry-After for requests refused because the store failed under `onStoreError: 'deny'`. */
const STORE_ERROR_RETRY_MS = 1_000;

/**
 * Decides a request against its rules: threshold from the config centre, identity, key, one store
 * call per rule; store failures are decided by `onStoreError`; rejections are logged by sampling.
 */
@Injectable()
export class RateLimiterService implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly options: ResolvedRateLimitOptions;
  private readonly thresholds: RuleThresholds;
  private readonly rejections: SampledLogger | undefined;
  private readonly storeErrors: SampledLogger;

  constructor(
    @Inject(RATE_LIMIT_OPTIONS) options: RateLimitModuleOptions,
    private readonly store: RateLimitStore,
    configCentre: RateLimitConfigCentre,
  ) {
    this.options = resolveModuleOptions(options);
    this.thresholds = new RuleThresholds(configCentre);
    const { logging } = this.options;
    if (logging) {
      this.rejections = new SampledLogger(this.logger, {
        ...logging,
        maxKeys: DEFAULT_LOG_MAX_TRACKED,
        summary: 'Rejected requests of other keys',
      });
    }
    this.storeErrors = new SampledLogger(this.logger, {
      intervalMs: logging ? logging.intervalMs : 10_000,
      maxLinesPerSecond: 1,
      maxKeys: 100,
      level: 'error',
      summary: 'Rate-limit store failed',
    });
  }

  onApplicationBootstrap(): void {
    this.logger.log(`Rate limiting with the ${this.store.description}`);
  }

  onApplicationShutdown(): void {
    this.rejections?.close();
    this.storeErrors.close();
  }

  /** Decides one request against all its rules. Rejects only for errors of the identity resolver. */
  async check(rules: readonly RateLimitRule[], context: ExecutionContext): Promise<RateLimitOutcome> {
    const decisions = await Promise.all(rules.map((rule) => this.decide(rule, context)));
    let reported: RuleDecision | undefined;
    let allowed = true;
    for (const decision of decisions) {
      if (!decision.allowed) {
        if (allowed || decision.resetMs > reported!.resetMs) reported = decision;
        allowed = false;
      } else if (allowed && !decision.fallback && (!reported || tighter(decision, reported))) {
        reported = decision;
      }
    }
    return { decisions, reported, allowed };
  }

  private async decide(rule: RateLimitRule, context: ExecutionContext): Promise<RuleDecision> {
    const thresholds = this.thresholds.resolve(rule);
    const identity = await identify(rule, context);
    const key = rateLimitKey(this.options.keyPrefix, rule.name, identity);
    let decision: RuleDecision;
    try {
      const result = await this.store.hit({ key, limit: thresholds.count, windowMs: thresholds.windowMs, cost: 1 });
      decision = { ...result, rule, identity, fallback: false };
    } catch (error) {
      decision = this.onStoreError(rule, identity, thresholds, error);
    }
    if (!decision.allowed) {
      this.rejections?.record(
        key,
        `Rejected by rule ${rule.name} (${thresholds.count} per ${thresholds.windowMs} ms), key ${key}`,
      );
    }
    return decision;
  }

  private onStoreError(rule: RateLimitRule, identity: string, thresholds: Thresholds, error: unknown): RuleDecision {
    const policy = this.options.onStoreError;
    const reason = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    this.storeErrors.record(
      reason,
      `Rate-limit store failed (${reason}); onStoreError '${policy}' ${policy === 'allow' ? 'admitted' : 'refused'} requests`,
    );
    return policy === 'allow'
      ? {
          allowed: true,
          limit: thresholds.count,
          remaining: thresholds.count,
          resetMs: thresholds.windowMs,
          rule,
          identity,
          fallback: true,
        }
      : {
          allowed: false,
          limit: thresholds.count,
          remaining: 0,
          resetMs: STORE_ERROR_RETRY_MS,
          rule,
          identity,
          fallback: true,
        };
  }
}

function tighter(a: RuleDecision, b: RuleDecision): boolean {
  return a.remaining < b.remaining || (a.remaining === b.remaining && a.resetMs > b.resetMs);
}

async function identify(rule: RateLimitRule, context: ExecutionContext): Promise<string> {
  const { by } = rule;
  if (by === 'global') return 'global';
  if (by === 'ip') {
    const request = context.switchToHttp().getRequest<{ ip?: string; socket?: { remoteAddress?: string } }>();
    return request.ip ?? request.socket?.remoteAddress ?? 'unknown-ip';
  }
  const identity: unknown = await by(context);
  if (typeof identity === 'number' && Number.isFinite(identity)) return String(identity);
  if (typeof identity !== 'string' || identity === '') {
    throw new Error(
      `@RateLimit on ${rule.declaredOn}: 'by' returned ${identity === '' ? 'an empty string' : String(identity)}; ` +
        'return a non-empty string, or throw an HttpException (e.g. BadRequestException) to refuse the request',
    );
  }
  return identity;
}

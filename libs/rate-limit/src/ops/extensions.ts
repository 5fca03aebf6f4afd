import type { Provider } from '@nestjs/common';
import type { Registry } from 'prom-client';
import { DECISION_OBSERVER, type DecisionObserver } from '../limiter/decision-observer.js';
import type { StepEntry } from '../limiter/limiter-step.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { RedisConfigCentre } from '../live/redis-config-centre.js';
import type { RateLimitExtension } from '../module/extension.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { MetricsStep } from './metrics.step.js';
import { RateLimitHealthIndicator } from './rate-limit-health.indicator.js';
import { RateLimitKeyAudit } from './rate-limit-key-audit.js';
import { RateLimitMetrics } from './rate-limit-metrics.js';

/** The prefix of every metric name, unless `prefix` says otherwise. */
const METRICS_PREFIX = 'rate_limit_';

/** Token of the metrics' limiter step (`RateLimitExtension.steps`). */
const METRICS_STEP = Symbol('RATE_LIMIT_METRICS_STEP');

/**
 * Prometheus metrics through `prom-client` (install it), in its default registry (the one
 * `@willsoto/nestjs-prometheus` serves) or the app's own `registry`, named from `prefix`
 * (default `'rate_limit_'`): decisions by rule and outcome, store call times and errors, the circuit
 * breaker, block cache hits, near-limit crossings, the live limits' state and the key audit's count.
 *
 * @example RateLimitModule.forRoot({ redis, extensions: [rateLimitMetrics({ registry, prefix: 'api_rl_' })] })
 */
export function rateLimitMetrics(options: { registry?: object; prefix?: string } = {}): RateLimitExtension {
  const fail = (field: string, problem: string, value?: unknown): never => {
    const got = value === undefined ? '' : `, got ${typeof value === 'string' ? JSON.stringify(value) : typeof value}`;
    throw new RateLimitConfigurationError(`rateLimitMetrics options: '${field}' ${problem}${got}`);
  };
  if (options === null || typeof options !== 'object') fail('options', 'must be an object', options);
  for (const field of Object.keys(options)) {
    if (field !== 'registry' && field !== 'prefix') fail(field, 'is no option (known: registry, prefix)');
  }
  const { registry, prefix = METRICS_PREFIX } = options;
  if (typeof prefix !== 'string' || !/^[a-zA-Z_:][a-zA-Z0-9_:]*$/.test(prefix)) {
    fail('prefix', 'must be the start of a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)', prefix);
  }
  if (registry !== undefined && (registry === null || typeof registry !== 'object')) {
    fail('registry', 'must be a prom-client Registry', registry);
  }
  const metrics: Provider = {
    provide: DECISION_OBSERVER,
    inject: [RedisService, RateLimitConfigCentre, RateLimitKeyAudit, RateLimitRuleRegistry],
    // prom-client is loaded here, when the app starts: an app without metrics need not have it.
    useFactory: async (
      redis: RedisService,
      centre: RateLimitConfigCentre,
      audit: RateLimitKeyAudit,
      rules: RateLimitRuleRegistry,
    ): Promise<RateLimitMetrics> => {
      let client: typeof import('prom-client');
      try {
        client = await import('prom-client');
      } catch {
        throw new RateLimitConfigurationError(
          'rateLimitMetrics() needs the package prom-client: npm install prom-client',
        );
      }
      return new RateLimitMetrics(client, (registry as Registry | undefined) ?? client.register, prefix, {
        circuitState: () => (redis.isConfigured ? redis.runner.circuitState : undefined),
        liveConfig: () => (centre instanceof RedisConfigCentre ? centre.state : undefined),
        keysWithoutTtl: () => audit.keysWithoutTtl,
        ruleNames: () => rules.all().map((rule) => rule.name),
        nearLimitRuleNames: () => rules.all().flatMap((rule) => (rule.nearLimit === undefined ? [] : [rule.name])),
        capRuleNames: () => rules.all().flatMap((rule) => (rule.concurrency === undefined ? [] : [rule.name])),
      });
    },
  };
  const step: Provider = {
    provide: METRICS_STEP,
    inject: [DECISION_OBSERVER],
    useFactory: (observer: DecisionObserver): StepEntry => ({ make: () => new MetricsStep(observer) }),
  };
  return { name: 'rateLimitMetrics', providers: [metrics, step, RateLimitKeyAudit], steps: [METRICS_STEP] };
}

/**
 * `RateLimitHealthIndicator`, for `@nestjs/terminus` or any health endpoint: Redis, the circuit
 * breaker, the scripts, the live limits, Redis's memory and the background key audit.
 *
 * @example RateLimitModule.forRoot({ redis, extensions: [rateLimitHealth()] })
 */
export function rateLimitHealth(): RateLimitExtension {
  return {
    name: 'rateLimitHealth',
    providers: [RateLimitHealthIndicator, RateLimitKeyAudit],
    exports: [RateLimitHealthIndicator],
  };
}

/**
 * `RateLimitKeyAudit`: the audit of the library's keys in Redis, on demand (`run`), as the
 * `nest-rate-limit-audit-keys` CLI runs it. Health and metrics bring their own background audit.
 *
 * @example RateLimitModule.forRoot({ redis, extensions: [rateLimitKeyAudit()] })
 */
export function rateLimitKeyAudit(): RateLimitExtension {
  return { name: 'rateLimitKeyAudit', providers: [RateLimitKeyAudit], exports: [RateLimitKeyAudit] };
}

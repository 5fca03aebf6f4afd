import { Logger, Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { TerminusModule } from '@nestjs/terminus';
import { RateLimitModule, type RateLimitMode } from 'nest-rate-limit';
import { MemoryConfigCentre, RedisConfigCentre, rateLimitManagement } from 'nest-rate-limit/live';
import { rateLimitHealth, rateLimitKeyAudit, rateLimitMetrics } from 'nest-rate-limit/ops';
import { type RateLimitStoreErrorPolicy, redisOptionsFromEnv } from 'nest-rate-limit/store';
import { AdminController } from './admin.controller.js';
import { AlgorithmsController } from './algorithms.controller.js';
import { FeaturesController } from './features.controller.js';
import { HealthController } from './health.controller.js';
import { JobsController } from './jobs.controller.js';
import { LimitsController } from './limits.controller.js';
import { OrdersController } from './orders.controller.js';
import { PlansController } from './plans.controller.js';
import { CompletionsController } from './completions.controller.js';
import { ExportsController } from './exports.controller.js';
import { GeocodeController } from './geocode.controller.js';
import { NearLimitDigest } from './near-limit-digest.js';

// One line per rule at once and a sum per 10 s: a flood of tenants near their limits writes no line each.
const nearLimitLog = new NearLimitDigest(new Logger('NearLimit'), 10_000);

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    TerminusModule,
    RateLimitModule.forRootAsync({
      // Every route without a rule of this name: 300 a minute per client IP and route, tunable live
      // under 'demo.default'. GET /ping (the load-test route) and the health routes skip it.
      defaults: [{ count: 300, window: '1m', configKey: 'demo.default' }],
      // Every optional part, which an app adds only when it wants it: the admin endpoints' live
      // limits, bans and overrides (and the CLI's catalogue of these rules); GET /metrics, from
      // prom-client's default registry; GET /health; and the key audit on demand (GET /admin/key-audit).
      extensions: [rateLimitManagement(), rateLimitMetrics(), rateLimitHealth(), rateLimitKeyAudit()],
      inject: [ConfigService],
      useFactory: (config: ConfigService) => {
        // REDIS_URL, REDIS_SENTINELS (+ REDIS_SENTINEL_NAME) or REDIS_CLUSTER_NODES; with none,
        // the embedded in-process store, so the demo runs with nothing installed.
        const redis = redisOptionsFromEnv({
          REDIS_URL: config.get<string>('REDIS_URL'),
          REDIS_SENTINELS: config.get<string>('REDIS_SENTINELS'),
          REDIS_SENTINEL_NAME: config.get<string>('REDIS_SENTINEL_NAME'),
          REDIS_CLUSTER_NODES: config.get<string>('REDIS_CLUSTER_NODES'),
        });
        return {
          redis,
          // Limits changed live (the admin endpoints, the CLI) over .env's: shared by every instance
          // through Redis, or held in this process without it.
          configCentre: redis ? RedisConfigCentre : MemoryConfigCentre,
          keyPrefix: config.get<string>('RATE_LIMIT_PREFIX') || undefined,
          storeErrors: { policy: config.get<RateLimitStoreErrorPolicy>('RATE_LIMIT_ON_STORE_ERROR') || undefined },
          // RATE_LIMIT_MODE=shadow tries every rule without rejecting anything.
          mode: config.get<RateLimitMode>('RATE_LIMIT_MODE') || undefined,
          // Kubernetes probes are not counted: the kubelet's user agent, from the networks it probes
          // from (here 10/8, and this host for a local try). A user agent alone is refused, since any
          // client can send it. The list is replaced live under 'demo.allow'.
          allow: {
            userAgents: [{ agent: 'kube-probe', from: ['10.0.0.0/8', '127.0.0.1', '::1'] }],
            configKey: 'demo.allow',
          },
          // A real app would email the customer; the demo logs it, by sampling.
          onNearLimit: ({ rule, identity, remaining }) => nearLimitLog.crossed(rule, identity, remaining),
        };
      },
    }),
  ],
  controllers: [
    LimitsController,
    OrdersController,
    PlansController,
    CompletionsController,
    AlgorithmsController,
    FeaturesController,
    JobsController,
    ExportsController,
    GeocodeController,
    HealthController,
    AdminController,
  ],
})
export class AppModule {}

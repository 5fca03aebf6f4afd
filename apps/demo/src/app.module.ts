import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { RateLimitModule, type RateLimitStoreErrorPolicy, redisOptionsFromEnv } from 'nest-rate-limit';
import { AlgorithmsController } from './algorithms.controller.js';
import { FeaturesController } from './features.controller.js';
import { HealthController } from './health.controller.js';
import { JobsController } from './jobs.controller.js';
import { LimitsController } from './limits.controller.js';
import { OrdersController } from './orders.controller.js';

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    RateLimitModule.forRootAsync({
      inject: [ConfigService],
      useFactory: (config: ConfigService) => ({
        // REDIS_URL, REDIS_SENTINELS (+ REDIS_SENTINEL_NAME) or REDIS_CLUSTER_NODES; with none,
        // the embedded in-process store, so the demo runs with nothing installed.
        redis: redisOptionsFromEnv({
          REDIS_URL: config.get<string>('REDIS_URL'),
          REDIS_SENTINELS: config.get<string>('REDIS_SENTINELS'),
          REDIS_SENTINEL_NAME: config.get<string>('REDIS_SENTINEL_NAME'),
          REDIS_CLUSTER_NODES: config.get<string>('REDIS_CLUSTER_NODES'),
        }),
        keyPrefix: config.get<string>('RATE_LIMIT_PREFIX') || undefined,
        storeErrors: { policy: config.get<RateLimitStoreErrorPolicy>('RATE_LIMIT_ON_STORE_ERROR') || undefined },
      }),
    }),
  ],
  controllers: [
    LimitsController,
    OrdersController,
    AlgorithmsController,
    FeaturesController,
    JobsController,
    HealthController,
  ],
})
export class AppModule {}

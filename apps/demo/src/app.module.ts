import { Module } from '@nestjs/common';
import { ConfigModule, ConfigService } from '@nestjs/config';
import { RateLimitModule } from '@app/rate-limit';
import { AlgorithmsController } from './algorithms.controller.js';
import { FeaturesController } from './features.controller.js';
import { HealthController } from './health.controller.js';
import { LimitsController } from './limits.controller.js';
import { OrdersController } from './orders.controller.js';

@Module({
  imports: [
    ConfigModule.forRoot({ isGlobal: true }),
    RateLimitModule.forRootAsync({
      inject: [ConfigService],
      useFactory: (config: ConfigService) => ({
        // No REDIS_URL: the embedded in-process store, so the demo runs with nothing installed.
        redis: config.get<string>('REDIS_URL') || undefined,
        keyPrefix: config.get<string>('RATE_LIMIT_PREFIX') || undefined,
      }),
    }),
  ],
  controllers: [LimitsController, OrdersController, AlgorithmsController, FeaturesController, HealthController],
})
export class AppModule {}

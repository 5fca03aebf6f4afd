import { Controller, Get, Header } from '@nestjs/common';
import { HealthCheck, HealthCheckService } from '@nestjs/terminus';
import { SkipRateLimit } from 'nest-rate-limit';
import { RateLimitHealthIndicator } from 'nest-rate-limit/ops';
import { register } from 'prom-client';

/** What a load balancer and Prometheus scrape; never rate-limited. */
@Controller()
@SkipRateLimit()
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly rateLimit: RateLimitHealthIndicator,
  ) {}

  /** 200 while the limiter's Redis answers (and on the embedded store); 503 when it does not. */
  @Get('health')
  @HealthCheck()
  check() {
    return this.health.check([() => this.rateLimit.isHealthy()]);
  }

  /** The limiter's metrics (`rateLimitMetrics()`: prom-client's default registry), with the process's. */
  @Get('metrics')
  @Header('Content-Type', register.contentType)
  metrics() {
    return register.metrics();
  }
}

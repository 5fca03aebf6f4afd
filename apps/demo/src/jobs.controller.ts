import { Controller, HttpCode, Param, Post } from '@nestjs/common';
import { RateLimiterService } from 'nest-rate-limit';

/** A tenant's jobs: 3 per 10 s. Declared as options, for work that no route's guard decides. */
const TENANT_JOBS = { name: 'demo-jobs', count: 3, window: '10s' } as const;

/**
 * Deciding outside the guard, as a queue worker or a cron job would: `consume` admits a job or says
 * how long to wait. (`reset`, which lifts a lockout, is an administrator's action: `AdminController`.)
 */
@Controller()
export class JobsController {
  constructor(private readonly limiter: RateLimiterService) {}

  /** Runs a job now or defers it: never a 429, the caller learns when to retry. */
  @Post('jobs/:tenant')
  @HttpCode(200)
  async run(@Param('tenant') tenant: string) {
    const outcome = await this.limiter.consume(TENANT_JOBS, tenant);
    if (outcome.allowed) return { ran: true, left: outcome.reported?.remaining };
    return { ran: false, retryInMs: outcome.reported?.resetMs };
  }
}

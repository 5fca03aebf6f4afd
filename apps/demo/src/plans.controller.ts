import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

/** A header of the request: the demo has no login, so the tenant and its plan come as headers. */
function header(context: ExecutionContext, name: string): string | undefined {
  return context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers[name];
}

@Controller()
export class PlansController {
  /**
   * Limits per plan, per tenant (`x-tenant`): 5 a minute, `x-plan: pro` 20, `x-plan: partner` 50.
   * Live values under `demo.reports` (and `demo.reports.pro`, `demo.reports.partner`); one tenant's
   * own limit with `set-override demo.reports <tenant> count=…`. At 80% of its limit, a tenant's
   * request is logged (`onNearLimit`) and counted in `rate_limit_near_limit_total`. An internal
   * caller (`x-internal: yes`) is not counted.
   */
  @Get('reports')
  @RateLimit({
    count: 5,
    window: '1m',
    configKey: 'demo.reports',
    by: (context) => header(context, 'x-tenant') ?? 'no-tenant',
    tiers: { of: (context) => header(context, 'x-plan'), limits: { pro: 20, partner: 50 } },
    nearLimit: 0.8,
    skipIf: (context) => header(context, 'x-internal') === 'yes',
  })
  reports() {
    return { reports: [] };
  }
}

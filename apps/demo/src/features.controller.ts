import { Controller, type ExecutionContext, Get, Query, UnauthorizedException } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

/** The upload size in MB (`?mb=`), as the request's cost. */
function uploadSizeMb(context: ExecutionContext): number {
  const { mb } = context.switchToHttp().getRequest<{ query: Record<string, string | undefined> }>().query;
  return mb === undefined ? 1 : Number(mb);
}

@Controller()
export class FeaturesController {
  /**
   * Several rules decided together: the route (50 per 10 s for everyone), the client (5 per 10 s)
   * and a daily quota (200 per day per client). A request rejected by one moves none of them.
   */
  @Get('multi')
  @RateLimit({ name: 'multi-route', count: 50, window: '10s', by: 'global' })
  @RateLimit({ name: 'multi-client', count: 5, window: '10s' })
  @RateLimit({ name: 'multi-daily', count: 200, window: '1d', algorithm: 'sliding-window' })
  multi() {
    return { rules: ['multi-route', 'multi-client', 'multi-daily'] };
  }

  /**
   * A login lockout: only failed attempts count (3 per minute per client); after the third, the
   * client is blocked for 5 minutes. `?password=demo` succeeds.
   */
  @Get('login')
  @RateLimit({ count: 3, window: '1m', countOn: 'failure', blockFor: '5m' })
  login(@Query('password') password?: string) {
    if (password !== 'demo') throw new UnauthorizedException('Wrong password');
    return { loggedIn: true };
  }

  /**
   * A budget for everyone, 20 per 10 s, leased: each instance takes 5 units from Redis at once and
   * admits from them without asking, so Redis sees one call per 5 requests. Meant for counters
   * hotter than one Redis key serves (tens of thousands a second); still never more than 20.
   */
  @Get('hot')
  @RateLimit({ count: 20, window: '10s', by: 'global', lease: 5 })
  hot() {
    return { leased: 5, limit: '20 per 10 s for everyone' };
  }

  /**
   * A limit being tried before it is enforced: 3 per 10 s per client, in shadow mode. Nothing is
   * ever rejected; would-be rejections are logged by sampling. Enforce it live with
   * `PATCH /admin/limits/demo.shadow {"mode":"enforce"}` (or `npm run limits -- set demo.shadow mode=enforce`).
   */
  @Get('shadow')
  @RateLimit({ count: 3, window: '10s', configKey: 'demo.shadow', mode: 'shadow' })
  shadow() {
    return { mode: 'shadow unless demo.shadow says otherwise' };
  }

  /** 10 MB per minute per client; a request costs its `?mb=` size. */
  @Get('upload')
  @RateLimit({ count: 10, window: '1m', cost: uploadSizeMb })
  upload(@Query('mb') mb?: string) {
    return { acceptedMb: mb === undefined ? 1 : Number(mb) };
  }
}

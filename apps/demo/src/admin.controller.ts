import { timingSafeEqual } from 'node:crypto';
import {
  BadRequestException,
  Body,
  type CanActivate,
  Controller,
  Delete,
  type ExecutionContext,
  Get,
  HttpCode,
  Injectable,
  NotFoundException,
  Param,
  Patch,
  Post,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import {
  RateLimitConfigurationError,
  RateLimitException,
  type RateLimitOptions,
  RateLimiterService,
} from 'nest-rate-limit';
import { RateLimitManagementService, type RateLimitOverride } from 'nest-rate-limit/live';

/**
 * Failed authentications: 10 a minute per client address, then that address's wrong tokens get a
 * 429 for 15 minutes. `by: 'ip'` counts the address given as the guard would (IPv6 per /64).
 */
const ADMIN_AUTH_FAILURES: RateLimitOptions & { name: string } = {
  name: 'admin-auth',
  count: 10,
  window: '1m',
  blockFor: '15m',
  by: 'ip',
};

interface AdminRequest {
  headers: Record<string, string | undefined>;
  ip?: string;
  socket: { remoteAddress?: string };
}

/**
 * Admits requests carrying `Authorization: Bearer <ADMIN_TOKEN>`. Without ADMIN_TOKEN set, the
 * admin endpoints are off: every request gets 404, as for a route that does not exist.
 *
 * Only a failed authentication (a wrong or missing token) is counted, with
 * `RateLimiterService.consume`; a request with the right token never reaches the limiter. So the
 * operator's own mistakes (a 400 for a bad value, a 500 while Redis blips) cost them nothing, and
 * nobody sharing their address can lock them out. A guesser gets 429s instead of 401s, but the
 * right token is admitted even then: what stops guessing is a long random token
 * (`openssl rand -hex 32`), not the limit.
 *
 * Why not `@RateLimit` on the controller: `countOn: 'failure'` counts every answer of 400 or more,
 * the operator's too, and a `cost` of 0 for the right token does not help once the address is
 * blocked (a `blockFor` penalty refuses every request of the identity, whatever its cost). The
 * guard knows which failures are authentication's, so it counts them.
 */
@Injectable()
class AdminTokenGuard implements CanActivate {
  constructor(
    private readonly config: ConfigService,
    private readonly limiter: RateLimiterService,
  ) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const token = this.config.get<string>('ADMIN_TOKEN');
    if (!token) throw new NotFoundException();
    const request = context.switchToHttp().getRequest<AdminRequest>();
    if (sameSecret(request.headers.authorization ?? '', `Bearer ${token}`)) return true;

    const address = request.ip ?? request.socket.remoteAddress ?? 'unknown';
    const outcome = await this.limiter.consume(ADMIN_AUTH_FAILURES, address);
    if (!outcome.allowed) {
      const retryAfter = Math.max(1, Math.ceil(outcome.reported!.resetMs / 1000));
      context
        .switchToHttp()
        .getResponse<{ setHeader(name: string, value: string): void }>()
        .setHeader('Retry-After', String(retryAfter));
      throw new RateLimitException(retryAfter, ADMIN_AUTH_FAILURES.name);
    }
    throw new UnauthorizedException();
  }
}

function sameSecret(given: string, expected: string): boolean {
  const actual = Buffer.from(given);
  const wanted = Buffer.from(expected);
  return actual.length === wanted.length && timingSafeEqual(actual, wanted);
}

/** A refused write is the caller's mistake: 400 with the message naming the field. */
async function refusedAs400<T>(operation: () => Promise<T>): Promise<T> {
  try {
    return await operation();
  } catch (error) {
    if (error instanceof RateLimitConfigurationError) throw new BadRequestException(error.problems);
    throw error;
  }
}

/**
 * Limits changed and counters read while the demo runs, through `RateLimitManagementService`:
 * with Redis, a change reaches every instance at once (`RedisConfigCentre`). Lockouts lifted
 * through `RateLimiterService.reset`. Every endpoint needs the admin token (`AdminTokenGuard`).
 */
@Controller('admin')
@UseGuards(AdminTokenGuard)
export class AdminController {
  constructor(
    private readonly limits: RateLimitManagementService,
    private readonly limiter: RateLimiterService,
  ) {}

  @Get('limits')
  list() {
    return this.limits.list();
  }

  @Get('limits/:configKey')
  get(@Param('configKey') configKey: string) {
    return refusedAs400(() => this.limits.get(configKey));
  }

  /** Body: any of `count`, `window`, `algorithm`, `mode`; `null` unsets a field. */
  @Patch('limits/:configKey')
  set(@Param('configKey') configKey: string, @Body() values: RateLimitOverride) {
    return refusedAs400(() => this.limits.set(configKey, values ?? {}));
  }

  @Delete('limits/:configKey')
  async delete(@Param('configKey') configKey: string) {
    return { deleted: await this.limits.delete(configKey) };
  }

  @Get('counters/:rule/:identity')
  inspect(@Param('rule') rule: string, @Param('identity') identity: string) {
    return refusedAs400(() => this.limits.inspect(rule, identity));
  }

  /** E.g. after support unblocks a customer: their counters and penalty under the rule are gone. */
  @Delete('counters/:rule/:identity')
  async reset(@Param('rule') rule: string, @Param('identity') identity: string) {
    await refusedAs400(() => this.limits.reset(rule, identity));
    return { reset: true };
  }

  /**
   * Lifts a client's `GET /login` lockout and forgets its failures, body `{ "ip": "203.0.113.7" }`:
   * the rule by its name, and the address counted as the guard counts it.
   */
  @Post('login/unlock')
  @HttpCode(204)
  async unlockLogin(@Body() body: { ip?: unknown } | undefined) {
    const ip = body?.ip;
    if (typeof ip !== 'string' || ip === '') throw new BadRequestException('Body: { "ip": "<the client address>" }');
    await this.limiter.reset('FeaturesController.login', ip);
  }
}

import { timingSafeEqual } from 'node:crypto';
import {
  BadRequestException,
  Body,
  type CanActivate,
  Controller,
  Delete,
  type ExecutionContext,
  Get,
  Injectable,
  NotFoundException,
  Param,
  Patch,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import {
  RateLimit,
  RateLimitConfigurationError,
  RateLimitManagementService,
  type RateLimitOverride,
} from 'nest-rate-limit';

/**
 * Admits requests carrying `Authorization: Bearer <ADMIN_TOKEN>`. Without ADMIN_TOKEN set, the
 * admin endpoints are off: every request gets 404, as for a route that does not exist.
 */
@Injectable()
class AdminTokenGuard implements CanActivate {
  constructor(private readonly config: ConfigService) {}

  canActivate(context: ExecutionContext): boolean {
    const token = this.config.get<string>('ADMIN_TOKEN');
    if (!token) throw new NotFoundException();
    const given = context.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>()
      .headers.authorization;
    const expected = Buffer.from(`Bearer ${token}`);
    const actual = Buffer.from(given ?? '');
    if (actual.length !== expected.length || !timingSafeEqual(actual, expected)) throw new UnauthorizedException();
    return true;
  }
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
 * with Redis, a change reaches every instance at once (`RedisConfigCentre`). Only failed calls
 * count, 10 a minute per client, then the client is locked out for 15 minutes: a token is not
 * found by guessing, and an operator's own calls are never limited.
 */
@Controller('admin')
@UseGuards(AdminTokenGuard)
@RateLimit({ name: 'admin', count: 10, window: '1m', countOn: 'failure', blockFor: '15m' })
export class AdminController {
  constructor(private readonly limits: RateLimitManagementService) {}

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
}

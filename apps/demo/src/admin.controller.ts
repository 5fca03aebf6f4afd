import { timingSafeEqual } from 'node:crypto';
import {
  BadRequestException,
  Body,
  type CanActivate,
  Controller,
  Delete,
  type ExecutionContext,
  ForbiddenException,
  Get,
  HttpCode,
  Injectable,
  NotFoundException,
  Param,
  Patch,
  Post,
  Put,
  Req,
  ServiceUnavailableException,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import {
  RateLimitConfigurationError,
  RateLimitException,
  type RateLimitOptions,
  RateLimiterService,
  SkipRateLimit,
} from 'nest-rate-limit';
import {
  RateLimitManagementService,
  type RateLimitOverride,
  RateLimitPermissionError,
  RateLimitStoreUnavailableError,
} from 'nest-rate-limit/live';
import { RateLimitKeyAudit } from 'nest-rate-limit/ops';
import { RedisService } from 'nest-rate-limit/store';

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
  /** The admitted caller, by the name of their token: who the change log says made a change. */
  adminName?: string;
}

/**
 * Admits requests carrying `Authorization: Bearer <token>`: ADMIN_TOKEN (its caller is `admin`), or
 * one of ADMIN_TOKENS, `name=token` pairs separated by commas (its caller is that name), so the
 * change log says who made each change. Without either set, the admin endpoints are off: every
 * request gets 404, as for a route that does not exist.
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
    const tokens = this.tokens();
    if (tokens.length === 0) throw new NotFoundException();
    const request = context.switchToHttp().getRequest<AdminRequest>();
    const given = request.headers.authorization ?? '';
    // Every token compared, so the time taken does not tell which one nearly matched.
    const matches = tokens.filter(([, token]) => sameSecret(given, `Bearer ${token}`));
    if (matches.length > 0) {
      request.adminName = matches[0][0];
      return true;
    }

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

  /** `[name, token]` of every admin token configured. */
  private tokens(): [string, string][] {
    const named = (this.config.get<string>('ADMIN_TOKENS') ?? '')
      .split(',')
      .map((pair): [string, string] => {
        const at = pair.indexOf('=');
        // No `=`: no name, and the entry is no token.
        return at <= 0 ? ['', ''] : [pair.slice(0, at).trim(), pair.slice(at + 1).trim()];
      })
      .filter(([name, token]) => name !== '' && token !== '');
    const token = this.config.get<string>('ADMIN_TOKEN');
    return token ? [['admin', token], ...named] : named;
  }
}

/** When a ban or an override ends: the body's `until` (a time) or `for` (a duration from now). */
function endOf(body: { until?: unknown; for?: unknown } | undefined): string {
  const end = body?.until ?? body?.for;
  if (typeof end !== 'string' || (body?.until !== undefined && body?.for !== undefined)) {
    throw new BadRequestException(
      'Body: { "until": "<ISO 8601 time>" } or { "for": "<duration, such as 1h>" }, one of them',
    );
  }
  // A bare number is no duration; the field is named as the caller wrote it.
  if (body?.for !== undefined && /^\s*\d+(\.\d+)?\s*$/.test(end)) {
    throw new BadRequestException(
      `Body: 'for' has no unit; give one, such as { "for": "${end.trim()}s" } or { "for": "1h" }`,
    );
  }
  return end;
}

function sameSecret(given: string, expected: string): boolean {
  const actual = Buffer.from(given);
  const wanted = Buffer.from(expected);
  return actual.length === wanted.length && timingSafeEqual(actual, wanted);
}

/**
 * A refused write is the caller's mistake: 400 with the message naming the field. One Redis
 * refuses for lack of permission (its ACL) is 403, with the message naming what it refused; one
 * Redis cannot take (full, or not answering) is 503, with the message saying why.
 */
async function refusedAs400<T>(operation: () => Promise<T>): Promise<T> {
  try {
    return await operation();
  } catch (error) {
    if (error instanceof RateLimitConfigurationError) throw new BadRequestException(error.problems);
    if (error instanceof RateLimitPermissionError) throw new ForbiddenException(error.message);
    if (error instanceof RateLimitStoreUnavailableError) throw new ServiceUnavailableException(error.message);
    throw error;
  }
}

/**
 * Limits changed and counters read while the demo runs, through `RateLimitManagementService`:
 * with Redis, a change reaches every instance at once (`RedisConfigCentre`). Every change is logged
 * with the caller's token name (`GET /admin/changes`). Every endpoint needs an admin token
 * (`AdminTokenGuard`).
 *
 * `@SkipRateLimit()`: no rule limits the operator's routes, the default one included, so neither
 * counts nor bans reach them: an operator whose address a `'*'` ban caught can still lift it here.
 */
@Controller('admin')
@SkipRateLimit()
@UseGuards(AdminTokenGuard)
export class AdminController {
  constructor(
    private readonly limits: RateLimitManagementService,
    private readonly keys: RateLimitKeyAudit,
    private readonly redis: RedisService,
  ) {}

  @Get('limits')
  list() {
    return refusedAs400(() => this.limits.list());
  }

  /** The latest live changes, newest first: what, by whom (the token's name), when. */
  @Get('changes')
  changes() {
    return refusedAs400(() => this.limits.changeLog());
  }

  @Get('limits/:configKey')
  get(@Param('configKey') configKey: string) {
    return refusedAs400(() => this.limits.get(configKey));
  }

  /** Body: any of `count`, `window`, `algorithm`, `mode`; `null` unsets a field. */
  @Patch('limits/:configKey')
  set(@Param('configKey') configKey: string, @Body() values: RateLimitOverride, @Req() request: AdminRequest) {
    return refusedAs400(() => this.limits.set(configKey, values ?? {}, { by: request.adminName }));
  }

  @Delete('limits/:configKey')
  async delete(@Param('configKey') configKey: string, @Req() request: AdminRequest) {
    return { deleted: await refusedAs400(() => this.limits.delete(configKey, { by: request.adminName })) };
  }

  @Get('counters/:rule/:identity')
  inspect(@Param('rule') rule: string, @Param('identity') identity: string) {
    return refusedAs400(() => this.limits.inspect(rule, identity));
  }

  /** E.g. after support unblocks a customer: their counters and penalty under the rule are gone. */
  @Delete('counters/:rule/:identity')
  async reset(@Param('rule') rule: string, @Param('identity') identity: string, @Req() request: AdminRequest) {
    await refusedAs400(() => this.limits.reset(rule, identity, { by: request.adminName }));
    return { reset: true };
  }

  /** The bans in force. */
  @Get('bans')
  bans() {
    return refusedAs400(() => this.limits.bans());
  }

  /**
   * Bans an identity on every instance, body `{ "until": "2026-12-31T23:59Z" }` or `{ "for": "1h" }`;
   * rule `*` bans it under every rule (and, for an address, every route limited by one).
   */
  @Put('bans/:rule/:identity')
  ban(
    @Param('rule') rule: string,
    @Param('identity') identity: string,
    @Body() body: { until?: string; for?: string } | undefined,
    @Req() request: AdminRequest,
  ) {
    return refusedAs400(() => this.limits.ban(rule, identity, endOf(body), { by: request.adminName }));
  }

  @Delete('bans/:rule/:identity')
  async unban(@Param('rule') rule: string, @Param('identity') identity: string, @Req() request: AdminRequest) {
    return { unbanned: await refusedAs400(() => this.limits.unban(rule, identity, { by: request.adminName })) };
  }

  /** The per-identity overrides in force. */
  @Get('overrides')
  overrides() {
    return refusedAs400(() => this.limits.overrides());
  }

  /**
   * An identity's own limit under a config key's rules, for a while: body
   * `{ "count": 20000, "until": "2026-12-31T23:59Z" }` (or `"for": "7d"`; `window` too).
   */
  @Put('overrides/:configKey/:identity')
  setOverride(
    @Param('configKey') configKey: string,
    @Param('identity') identity: string,
    @Body() body: (RateLimitOverride & { until?: string; for?: string }) | undefined,
    @Req() request: AdminRequest,
  ) {
    const { until: _until, for: _for, ...values } = body ?? {};
    return refusedAs400(() =>
      this.limits.setOverride(configKey, identity, values, endOf(body), { by: request.adminName }),
    );
  }

  @Delete('overrides/:configKey/:identity')
  async deleteOverride(
    @Param('configKey') configKey: string,
    @Param('identity') identity: string,
    @Req() request: AdminRequest,
  ) {
    return {
      deleted: await refusedAs400(() => this.limits.deleteOverride(configKey, identity, { by: request.adminName })),
    };
  }

  /** The library's keys in Redis without a TTL, as `npm run audit:keys` reports them (`RateLimitKeyAudit`). */
  @Get('key-audit')
  keyAudit() {
    if (!this.redis.isConfigured) throw new NotFoundException('No Redis: the in-process store keeps no keys to audit');
    return this.keys.run({ maxListed: 100 });
  }

  /**
   * Lifts a client's `GET /login` lockout and forgets its failures, body `{ "ip": "203.0.113.7" }`:
   * the rule by its name, and the address counted as the guard counts it.
   */
  @Post('login/unlock')
  @HttpCode(204)
  async unlockLogin(@Body() body: { ip?: unknown } | undefined, @Req() request: AdminRequest) {
    const ip = body?.ip;
    if (typeof ip !== 'string' || ip === '') throw new BadRequestException('Body: { "ip": "<the client address>" }');
    await refusedAs400(() => this.limits.reset('FeaturesController.login', ip, { by: request.adminName }));
  }
}

import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  Injectable,
  Module,
  UnauthorizedException,
  UseGuards,
} from '@nestjs/common';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { LogCapture } from '../support/log-capture.js';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

interface AuthenticatedRequest {
  headers: Record<string, string | undefined>;
  user?: { id: string };
}

/** The auth guard of Nest's docs, cut down: `Authorization: Bearer <user>` sets `req.user`, else 401. */
@Injectable()
class AuthGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest<AuthenticatedRequest>();
    const [scheme, user] = req.headers.authorization?.split(' ') ?? [];
    if (scheme !== 'Bearer' || !user) throw new UnauthorizedException();
    req.user = { id: user };
    return true;
  }
}

/** The first per-user limit a Nest user writes: an auth guard on the controller, `by` reading `req.user`. */
@Controller('profile')
@UseGuards(AuthGuard)
class ProfileController {
  @Get()
  @RateLimit({ count: 2, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<AuthenticatedRequest>().user?.id })
  get() {
    return { ok: true };
  }
}

/** A per-address rule on the class and a per-user one on the handler: both decided, in one call. */
@Controller('orders')
@UseGuards(AuthGuard)
@RateLimit({ name: 'orders-per-address', count: 3, window: '1m' })
class OrdersController {
  @Get()
  @RateLimit({ count: 1, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<AuthenticatedRequest>().user?.id })
  list() {
    return [];
  }
}

/**
 * A login an attacker floods with guessed credentials: a per-address rule, and beside it a per-user
 * rule that waits for the auth guard. The guard refuses every guess; the per-address rule must
 * still count them.
 */
@Controller('login')
@UseGuards(AuthGuard)
class LoginController {
  @Get()
  @RateLimit({ name: 'login-ip', count: 3, window: '1m' })
  @RateLimit({
    name: 'login-user',
    count: 100,
    window: '1m',
    by: (ctx) => ctx.switchToHttp().getRequest<AuthenticatedRequest>().user?.id,
  })
  login() {
    return { ok: true };
  }
}

/** The same controller in a feature module that does not import RateLimitModule, as apps lay them out. */
@Controller('account')
@UseGuards(AuthGuard)
class AccountController {
  @Get()
  @RateLimit({ count: 1, window: '1m', by: (ctx) => ctx.switchToHttp().getRequest<AuthenticatedRequest>().user?.id })
  get() {
    return { ok: true };
  }
}

@Module({ controllers: [AccountController] })
class AccountModule {}

describeStoresAndPlatforms('per-user limits behind an auth guard', (store, platform) => {
  let app: INestApplication | undefined;
  let logs: LogCapture;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start() {
    logs = new LogCapture();
    app = await createTestApp({
      controllers: [ProfileController, OrdersController, LoginController],
      imports: [AccountModule],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
      platform,
      logger: logs,
    });
    return app;
  }

  const get = (path: string, user?: string) => {
    const req = request(app!.getHttpServer()).get(path);
    return user ? req.set('authorization', `Bearer ${user}`) : req;
  };

  it('counts each user apart, after the auth guard set req.user', async () => {
    await start();
    const alice = [];
    for (let i = 0; i < 3; i += 1) alice.push((await get('/profile', 'alice')).status);
    expect(alice).toEqual([200, 200, 429]);
    // Bob has a counter of his own: his first requests are admitted.
    expect((await get('/profile', 'bob')).status).toBe(200);
    expect((await get('/profile', 'bob')).headers['ratelimit-remaining']).toBe('0');
    // Nobody was counted anonymously, so nothing was said about it.
    expect(logs.at('warn', /anonymous/)).toEqual([]);
  });

  it('lets the auth guard answer 401 to a request without credentials, and counts none of them', async () => {
    await start();
    const statuses = [];
    for (let i = 0; i < 5; i += 1) statuses.push((await get('/profile')).status);
    expect(statuses).toEqual([401, 401, 401, 401, 401]);
    expect((await get('/profile', 'carol')).status).toBe(200);
  });

  it('decides the per-address rule before the auth guard and the per-user rule after it', async () => {
    await start();
    const first = await get('/orders', 'alice');
    expect(first.status).toBe(200);
    // The headers report the tightest rule of both parts: Alice's own, with nothing left.
    expect(first.headers['ratelimit-limit']).toBe('1');
    expect(first.headers['ratelimit-remaining']).toBe('0');
    // Alice's own limit refuses her; the per-address rule, decided before, counted the request.
    const second = await get('/orders', 'alice');
    expect(second.status).toBe(429);
    expect(second.body.message).toMatch(/OrdersController\.list/);
    expect((await get('/orders', 'bob')).status).toBe(200);
    // Three requests from this address: the class rule now refuses anyone else here.
    const refused = await get('/orders', 'dave');
    expect(refused.status).toBe(429);
    expect(refused.body.message).toMatch(/orders-per-address/);
  });

  it('counts by address the requests the auth guard refuses, beside a per-user rule', async () => {
    await start();
    const statuses = [];
    for (let i = 0; i < 8; i += 1) statuses.push((await get('/login')).status);
    expect(statuses).toEqual([401, 401, 401, 429, 429, 429, 429, 429]);
    const refused = await get('/login', 'alice');
    expect(refused.status).toBe(429);
    expect(refused.body.message).toMatch(/login-ip/);
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
  });

  it('works in a feature module that does not import RateLimitModule', async () => {
    await start();
    expect((await get('/account', 'alice')).status).toBe(200);
    expect((await get('/account', 'alice')).status).toBe(429);
    expect((await get('/account', 'bob')).status).toBe(200);
    expect((await get('/account')).status).toBe(401);
  });
});

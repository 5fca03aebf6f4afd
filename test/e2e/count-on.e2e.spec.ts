import {
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  type NestInterceptor,
  type CallHandler,
  RequestTimeoutException,
  Res,
  UnauthorizedException,
  UseInterceptors,
  Injectable,
  Query,
  type CanActivate,
  UseGuards,
} from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import { type Observable, TimeoutError, catchError, throwError, timeout } from 'rxjs';
import request from 'supertest';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RateLimit, RateLimitGuard } from 'nest-rate-limit';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

/** Turns a handler slower than 50 ms into a 408, as a timeout interceptor in an app would. */
@Injectable()
class TimeoutInterceptor implements NestInterceptor {
  intercept(_context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(50),
      catchError((error: unknown) =>
        throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error)),
      ),
    );
  }
}

/** A guard that runs after the rate-limit guard and refuses requests with `?deny`. */
@Injectable()
class DenyGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    return !('deny' in context.switchToHttp().getRequest<{ query: object }>().query);
  }
}

@Controller('count-on')
class CountOnController {
  /** The guard twice: globally and here. The request is counted, and refunded, once. */
  @Get('twice')
  @RateLimit({ count: 2, window: '1h', countOn: 'failure' })
  @UseGuards(RateLimitGuard)
  twice(@Query('password') password: string) {
    if (password !== 'right') throw new UnauthorizedException();
    return { ok: true };
  }

  /** A later guard refuses some requests: they never reach interceptors or the handler. */
  @Get('guarded')
  @RateLimit({ count: 2, window: '1h', countOn: 'success' })
  @UseGuards(DenyGuard)
  guarded() {
    return { ok: true };
  }

  /** A login: only failed attempts count toward the lockout. */
  @Get('login')
  @RateLimit({ count: 2, window: '1h', countOn: 'failure' })
  login(@Query('password') password: string) {
    if (password !== 'right') throw new UnauthorizedException();
    return { ok: true };
  }

  /** Only work that succeeded counts. */
  @Get('work')
  @RateLimit({ count: 2, window: '1h', countOn: 'success' })
  @UseInterceptors(TimeoutInterceptor)
  async work(@Query('outcome') outcome: string) {
    if (outcome === 'throw') throw new Error('handler failed');
    if (outcome === 'hang') await new Promise(() => undefined);
    return { ok: true };
  }

  /** A response whose stream breaks part-way. */
  @Get('stream')
  @RateLimit({ count: 1, window: '1h', countOn: 'success' })
  stream(@Res() response: ServerResponse | { raw: ServerResponse }, @Query('complete') complete?: string) {
    const raw = 'raw' in response ? response.raw : response;
    raw.writeHead(200, { 'content-type': 'text/plain' });
    if (complete !== undefined) {
      raw.end('whole');
      return;
    }
    raw.write('partial');
    raw.destroy();
  }
}

describeStoresAndPlatforms('countOn refunds', (store, platform) => {
  let app: INestApplication;

  beforeAll(async () => {
    app = await createTestApp({
      platform,
      controllers: [CountOnController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
  });

  afterAll(async () => {
    await app?.close();
  });

  it("'failure': successful requests are refunded, failed ones count", async () => {
    const http = request(app.getHttpServer());
    const right = await sequential(5, () => http.get('/count-on/login').query({ password: 'right' }));
    expect(right.statuses).toEqual(Array(5).fill(200));
    await http.get('/count-on/login').query({ password: 'wrong' }).expect(401);
    await http.get('/count-on/login').query({ password: 'wrong' }).expect(401);
    await http.get('/count-on/login').query({ password: 'right' }).expect(429);
  });

  it("'success': requests whose handler throws or times out are refunded", async () => {
    const http = request(app.getHttpServer());
    for (let i = 0; i < 3; i += 1) {
      await http.get('/count-on/work').query({ outcome: 'throw' }).expect(500);
      await http.get('/count-on/work').query({ outcome: 'hang' }).expect(408);
    }
    await http.get('/count-on/work').expect(200);
    await http.get('/count-on/work').expect(200);
    await http.get('/count-on/work').expect(429);
  });

  it('counts and refunds once when the guard is registered twice', async () => {
    const http = request(app.getHttpServer());
    await http.get('/count-on/twice').query({ password: 'wrong' }).expect(401);
    const right = await sequential(3, () => http.get('/count-on/twice').query({ password: 'right' }));
    expect(right.statuses).toEqual([200, 200, 200]);
    await http.get('/count-on/twice').query({ password: 'wrong' }).expect(401);
    await http.get('/count-on/twice').query({ password: 'right' }).expect(429);
  });

  it("'success': requests a later guard refuses are refunded", async () => {
    const http = request(app.getHttpServer());
    const denied = await sequential(3, () => http.get('/count-on/guarded').query({ deny: '' }));
    expect(denied.statuses).toEqual([403, 403, 403]);
    await http.get('/count-on/guarded').expect(200);
    await http.get('/count-on/guarded').expect(200);
    await http.get('/count-on/guarded').expect(429);
  });

  it("'success': a response whose stream breaks is refunded", async () => {
    const http = request(app.getHttpServer());
    for (let i = 0; i < 3; i += 1) {
      await expect(http.get('/count-on/stream')).rejects.toThrow();
    }
    // The one unit is still there: none of the broken responses counted.
    await http.get('/count-on/stream').query({ complete: '' }).expect(200);
    await http.get('/count-on/stream').query({ complete: '' }).expect(429);
  });
});

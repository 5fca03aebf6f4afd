import { Controller, Get, type INestApplication, Query, UnauthorizedException } from '@nestjs/common';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from '@app/rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { PLATFORMS, createTestApp, uniquePrefix } from '../support/test-app.js';

/** The time a password check takes (a slow hash), so concurrent logins really are in flight together. */
const CHECK_MS = 20;

@Controller('in-flight')
class LoginController {
  /** Only failed attempts count: 3 per minute per user, then a 5-minute lockout. */
  @Get('login')
  @RateLimit({
    count: 3,
    window: '1m',
    countOn: 'failure',
    blockFor: '5m',
    by: (context) => context.switchToHttp().getRequest<{ query: { user: string } }>().query.user,
  })
  async login(@Query('password') password: string) {
    await new Promise((resolve) => setTimeout(resolve, CHECK_MS));
    if (password !== 'right') throw new UnauthorizedException('Wrong password');
    return { loggedIn: true };
  }
}

let server: RedisServer | undefined;
const matrix = [
  { store: 'Redis', url: async () => (server ??= await startRedisServer()).url },
  { store: 'memory', url: () => Promise.resolve(undefined) },
].flatMap((store) => PLATFORMS.map((platform) => ({ ...store, platform })));

describe.each(matrix)(
  'a blockFor penalty starts only on settled outcomes: $store store, $platform',
  ({ url, platform }) => {
    let app: INestApplication;
    let users = 0;
    const user = () => `user-${(users += 1)}`;

    beforeAll(async () => {
      app = await createTestApp({
        platform,
        controllers: [LoginController],
        rateLimit: { redis: await url(), keyPrefix: uniquePrefix() },
      });
      await app.listen(0, '127.0.0.1');
    });

    afterAll(async () => {
      await app?.close();
      await server?.stop();
      server = undefined;
    });

    const login = (name: string, password: string) =>
      request(app.getHttpServer())
        .get('/in-flight/login')
        .query({ user: name, password })
        .then((response) => response.status);

    const concurrently = (n: number, name: string, password: string) =>
      Promise.all(Array.from({ length: n }, () => login(name, password)));

    it.each([10, 50])('%i concurrent right-password logins all succeed and lock nobody out', async (n) => {
      const name = user();
      expect(await concurrently(n, name, 'right')).toEqual(Array.from({ length: n }, () => 200));
      // The whole budget of failures is still there.
      for (let i = 0; i < 3; i += 1) expect(await login(name, 'wrong')).toBe(401);
      expect(await login(name, 'right')).toBe(429);
    });

    it('10 concurrent wrong passwords: exactly 3 are checked, then the lockout starts', async () => {
      const name = user();
      const statuses = await concurrently(10, name, 'wrong');
      expect(statuses.filter((status) => status === 401)).toHaveLength(3);
      expect(statuses.filter((status) => status === 429)).toHaveLength(7);
      expect(await login(name, 'right')).toBe(429);
    });

    it('settled failures above the limit lock out, as before', async () => {
      const name = user();
      for (let i = 0; i < 3; i += 1) expect(await login(name, 'wrong')).toBe(401);
      expect(await login(name, 'wrong')).toBe(429);
      expect(await login(name, 'right')).toBe(429);
    });

    it('a client that goes away before its answer counts as a failure: disconnecting escapes nothing', async () => {
      const name = user();
      const { port } = app.getHttpServer().address() as AddressInfo;
      for (let i = 0; i < 3; i += 1) {
        await new Promise<void>((resolve) => {
          const sent = httpRequest({
            host: '127.0.0.1',
            port,
            path: `/in-flight/login?user=${name}&password=guess${i}`,
          });
          sent.on('error', () => resolve());
          sent.on('close', () => resolve());
          // Gone while the password is being checked.
          sent.end(() => setTimeout(() => sent.destroy(), CHECK_MS / 2));
        });
      }
      // Even the right password is refused now: the three guesses counted, and the fourth attempt locks out.
      expect(await login(name, 'right')).toBe(429);
    });
  },
);

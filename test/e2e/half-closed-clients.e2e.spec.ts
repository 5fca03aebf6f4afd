import { Controller, Get, type INestApplication, Query, UnauthorizedException } from '@nestjs/common';
import { type AddressInfo, connect } from 'node:net';
import request from 'supertest';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { describeStoresAndPlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

/** The time a password check takes (a slow hash): the client's half-close reaches the server before the answer. */
const CHECK_MS = 20;

@Controller('half-closed')
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

/**
 * Sends one request on a raw socket and shuts the socket's sending side at once (`end`: a FIN, as
 * `nc -N` does), then reads until the server closes. Resolves with the status of the answer, or 0
 * when none came.
 */
function halfClosedRequest(port: number, path: string): Promise<number> {
  return new Promise((resolve) => {
    let answer = '';
    const socket = connect(port, '127.0.0.1', () => {
      socket.end(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
    });
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => (answer += chunk));
    const done = () => resolve(Number(/^HTTP\/1\.1 (\d{3}) /.exec(answer)?.[1] ?? 0));
    socket.on('error', done);
    socket.on('close', done);
  });
}

describeStoresAndPlatforms('a client that half-closes after its request still reads its answer', (store, platform) => {
  let app: INestApplication;
  let port: number;
  let users = 0;
  const user = () => `user-${(users += 1)}`;

  beforeAll(async () => {
    app = await createTestApp({
      platform,
      controllers: [LoginController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix() },
    });
    await app.listen(0, '127.0.0.1');
    port = (app.getHttpServer() as { address(): AddressInfo }).address().port;
  });

  afterAll(async () => {
    await app?.close();
  });

  const login = (name: string, password: string) =>
    halfClosedRequest(port, `/half-closed/login?user=${name}&password=${password}`);

  const attempt = (name: string, password: string) =>
    request(app.getHttpServer()).get('/half-closed/login').query({ user: name, password });

  it('right-password logins are answered 200 and count as the successes they are: no failure, no lockout', async () => {
    const name = user();
    const answers: number[] = [];
    for (let i = 0; i < 5; i += 1) answers.push(await login(name, 'right'));
    expect(answers).toEqual([200, 200, 200, 200, 200]);
    // The whole budget of failures is still there.
    expect((await sequential(3, () => attempt(name, 'wrong'))).statuses).toEqual([401, 401, 401]);
    expect((await attempt(name, 'right')).status).toBe(429);
  });

  it('wrong-password logins are answered 401 and count as failures: half-closing escapes nothing', async () => {
    const name = user();
    const answers: number[] = [];
    for (let i = 0; i < 4; i += 1) answers.push(await login(name, `guess${i}`));
    expect(answers).toEqual([401, 401, 401, 429]);
    expect(await login(name, 'right')).toBe(429);
  });
});

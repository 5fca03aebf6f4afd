import type { IncomingMessage } from 'node:http';
import type { ExecutionContext, INestApplication } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { WsAdapter } from '@nestjs/platform-ws';
import { Test } from '@nestjs/testing';
import { type OnGatewayConnection, SubscribeMessage, WebSocketGateway, type WsResponse } from '@nestjs/websockets';
import { RateLimit, RateLimitModule, type RateLimitWsError } from 'nest-rate-limit';
import type { WebSocket } from 'ws';
import { afterEach, expect, it } from 'vitest';
import { describeStores } from '../support/matrix.js';
import { uniquePrefix } from '../support/test-app.js';
import { closeWsClients, connectWs, sendWs } from '../support/ws-client.js';

/**
 * A gateway on Nest's plain WebSocket adapter (`@nestjs/platform-ws`), talked to by real `ws`
 * clients: `by: 'ip'` reads the address of the client's socket (a `ws` client has no handshake
 * object), and a refusal reaches the client as the `exception` message Nest's gateway filter
 * sends a native WebSocket, `{ event: 'exception', data: RateLimitWsError }`.
 */

/** The user each connection named in its upgrade request's `x-user` header. */
const users = new WeakMap<object, string>();

/** 1 a minute per user: a `ws` client keeps no headers, so the gateway kept the user at connection. */
function userOf(context: ExecutionContext): string | undefined {
  return users.get(context.switchToWs().getClient<WebSocket>());
}

@WebSocketGateway({ path: '/chat' })
class ChatGateway implements OnGatewayConnection {
  handleConnection(client: WebSocket, request: IncomingMessage): void {
    const user = request.headers['x-user'];
    if (typeof user === 'string') users.set(client, user);
  }

  /** 2 a minute per client address. */
  @SubscribeMessage('ping')
  @RateLimit({ count: 2, window: '1m' })
  ping(): WsResponse<string> {
    return { event: 'pong', data: 'pong' };
  }

  /** 1 a minute per user. */
  @SubscribeMessage('shout')
  @RateLimit({ count: 1, window: '1m', by: userOf })
  shout(): WsResponse<string> {
    return { event: 'heard', data: 'heard' };
  }

  @SubscribeMessage('free')
  free(): WsResponse<string> {
    return { event: 'free', data: 'free' };
  }
}

describeStores('@RateLimit on WebSocket gateways (ws adapter)', (store) => {
  let app: INestApplication | undefined;

  afterEach(async () => {
    closeWsClients();
    await app?.close();
    app = undefined;
  });

  /** The gateway's URL, on the app's own HTTP server. */
  async function start(): Promise<string> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        RateLimitModule.forRoot({ redis: await store.redis(), keyPrefix: uniquePrefix() }),
      ],
      providers: [ChatGateway],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    app.useWebSocketAdapter(new WsAdapter(app));
    await app.listen(0, '127.0.0.1');
    return `${(await app.getUrl()).replace(/^http/, 'ws')}/chat`;
  }

  it('answers messages up to the limit, then sends an exception with the retry time', async () => {
    const url = await start();
    const socket = await connectWs(url);
    expect(await sendWs(socket, 'ping')).toEqual({ event: 'pong', data: 'pong' });
    expect(await sendWs(socket, 'ping')).toEqual({ event: 'pong', data: 'pong' });
    expect(await sendWs(socket, 'ping', { id: 7 })).toEqual({
      event: 'exception',
      data: {
        status: 'error',
        message: "Too many requests (rate limit 'ChatGateway.ping'); retry in 60 s",
        retryAfter: 60,
        rule: 'ChatGateway.ping',
        pattern: 'ping',
        id: 7,
      } satisfies RateLimitWsError,
    });
    // The refusal answers that message only: the connection stays open and its other messages pass.
    expect(await sendWs(socket, 'free')).toEqual({ event: 'free', data: 'free' });
  });

  it('counts by client address: a second connection from it shares the counter, another address does not', async () => {
    const url = await start();
    const first = await connectWs(url);
    for (let i = 0; i < 2; i += 1) expect((await sendWs(first, 'ping')).event).toBe('pong');
    const sameAddress = await connectWs(url);
    expect(await sendWs<RateLimitWsError>(sameAddress, 'ping')).toMatchObject({
      event: 'exception',
      data: { rule: 'ChatGateway.ping', retryAfter: 60 },
    });
    const otherAddress = await connectWs(url, { from: '127.0.0.2' });
    expect(await sendWs(otherAddress, 'ping')).toEqual({ event: 'pong', data: 'pong' });
    expect(await sendWs(otherAddress, 'ping')).toEqual({ event: 'pong', data: 'pong' });
    expect((await sendWs(otherAddress, 'ping')).event).toBe('exception');
  });

  it('counts by an identity from the client', async () => {
    const url = await start();
    const ada = await connectWs(url, { headers: { 'x-user': 'ada' } });
    const grace = await connectWs(url, { headers: { 'x-user': 'grace' } });
    expect(await sendWs(ada, 'shout')).toEqual({ event: 'heard', data: 'heard' });
    expect(await sendWs(ada, 'shout')).toMatchObject({ event: 'exception', data: { rule: 'ChatGateway.shout' } });
    // Same address, another user.
    expect(await sendWs(grace, 'shout')).toEqual({ event: 'heard', data: 'heard' });
  });
});

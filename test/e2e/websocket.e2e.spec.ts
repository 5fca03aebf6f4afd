import type { INestApplication } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { type ExecutionContext } from '@nestjs/common';
import { ConnectedSocket, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { RateLimit, RateLimitModule, type RateLimitWsError } from 'nest-rate-limit';
import type { Socket } from 'socket.io-client';
import { afterEach, expect, it } from 'vitest';
import { describeStores } from '../support/matrix.js';
import { connectSocket, disconnectSockets, sendMessage } from '../support/socket.js';
import { uniquePrefix } from '../support/test-app.js';

/** A socket.io client's own id: one counter per connection. */
function connectionOf(context: ExecutionContext): string {
  return context.switchToWs().getClient<{ id: string }>().id;
}

@WebSocketGateway()
class ChatGateway {
  /** 2 a minute per client address (the handshake's). */
  @SubscribeMessage('ping')
  @RateLimit({ count: 2, window: '1m' })
  ping() {
    return 'pong';
  }

  /** 1 a minute per connection. */
  @SubscribeMessage('shout')
  @RateLimit({ count: 1, window: '1m', by: connectionOf })
  shout() {
    return 'heard';
  }
}

/** The connections whose `relay` messages ran, in order. */
const relayed: string[] = [];

@WebSocketGateway()
class RelayGateway {
  /** One a second for everyone; the others wait up to 2 s for room. */
  @SubscribeMessage('relay')
  @RateLimit({ count: 1, window: '1s', by: 'global', wait: { maxMs: '2s' } })
  relay(@ConnectedSocket() client: { id: string }) {
    relayed.push(client.id);
    return 'relayed';
  }
}

describeStores('@RateLimit on WebSocket gateways (socket.io)', (store) => {
  let app: INestApplication | undefined;

  afterEach(async () => {
    disconnectSockets();
    await app?.close();
    app = undefined;
  });

  async function start(): Promise<string> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        RateLimitModule.forRoot({ redis: await store.redis(), keyPrefix: uniquePrefix() }),
      ],
      providers: [ChatGateway, RelayGateway],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');
    return app.getUrl();
  }

  const send = (socket: Socket, event: string, data: object = {}) => sendMessage<RateLimitWsError>(socket, event, data);

  it('acknowledges messages up to the limit, then sends an exception with the retry time', async () => {
    const url = await start();
    const socket = await connectSocket(url);
    expect(await send(socket, 'ping')).toEqual({ ack: 'pong' });
    expect(await send(socket, 'ping')).toEqual({ ack: 'pong' });
    const rejected = await send(socket, 'ping');
    expect(rejected).toEqual({
      exception: {
        status: 'error',
        message: "Too many requests (rate limit 'ChatGateway.ping'); retry in 60 s",
        retryAfter: 60,
        rule: 'ChatGateway.ping',
        pattern: 'ping',
      },
    });
    // Counted per client address: another connection from the same address shares the counter.
    const other = await connectSocket(url);
    expect(await send(other, 'ping')).toMatchObject({ exception: { retryAfter: 60 } });
  });

  it('says which message it refused: its pattern, and the id the client gave it', async () => {
    const url = await start();
    const socket = await connectSocket(url);
    const refusals: RateLimitWsError[] = [];
    const acks: unknown[] = [];
    const allAnswered = new Promise<void>((resolve) => {
      const answered = () => acks.length + refusals.length === 6 && resolve();
      socket.on('exception', (exception: RateLimitWsError) => {
        refusals.push(exception);
        answered();
      });
      // Several messages in flight at once: only the refusals' ids tell which ones went unanswered.
      const ack = (answer: unknown) => {
        acks.push(answer);
        answered();
      };
      for (let id = 1; id <= 4; id += 1) socket.emit('ping', { id }, ack);
      socket.emit('shout', { id: 'shout-1' }, ack);
      socket.emit('shout', { id: 'shout-2' }, ack);
    });
    await allAnswered;
    expect(acks.sort()).toEqual(['heard', 'pong', 'pong']);
    expect(refusals.map(({ pattern, id }) => ({ pattern, id }))).toEqual(
      expect.arrayContaining([
        { pattern: 'ping', id: expect.any(Number) },
        { pattern: 'ping', id: expect.any(Number) },
        { pattern: 'shout', id: expect.stringMatching(/^shout-/) },
      ]),
    );
    expect(refusals).toHaveLength(3);
  });

  it('counts by an identity from the client', async () => {
    const url = await start();
    const [first, second] = [await connectSocket(url), await connectSocket(url)];
    expect(await send(first, 'shout')).toEqual({ ack: 'heard' });
    expect(await send(first, 'shout')).toMatchObject({ exception: { rule: 'ChatGateway.shout' } });
    expect(await send(second, 'shout')).toEqual({ ack: 'heard' });
  });

  it('a message over a waiting rule waits for room; one whose client leaves while it waits never runs', async () => {
    const url = await start();
    relayed.length = 0;
    const leaving = await connectSocket(url);
    // Its first message takes the second's room; its second waits for the next second.
    expect(await send(leaving, 'relay')).toEqual({ ack: 'relayed' });
    leaving.emit('relay', {});
    // The client goes while its message waits; another then waits for that room, and gets it.
    const staying = await connectSocket(url);
    const left = leaving.id;
    leaving.disconnect();
    const answer = send(staying, 'relay');
    expect(await answer).toEqual({ ack: 'relayed' });
    expect(relayed).toEqual([left, staying.id]);
  });
});

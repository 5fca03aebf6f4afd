import { type CanActivate, type INestApplication, UseGuards } from '@nestjs/common';
import { ApolloDriver, type ApolloDriverConfig } from '@nestjs/apollo';
import { Args, GraphQLModule, Mutation, Query, Resolver } from '@nestjs/graphql';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { SubscribeMessage, WebSocketGateway, WsException } from '@nestjs/websockets';
import { RateLimit, RateLimitModule } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { describeStores } from '../support/matrix.js';
import { connectSocket, disconnectSockets, sendMessage } from '../support/socket.js';
import { uniquePrefix } from '../support/test-app.js';

@Resolver()
class AccountResolver {
  @Query(() => String)
  ping() {
    return 'pong';
  }

  /** A lockout: only failed logins count, 2 a minute per client. */
  @Mutation(() => Boolean)
  @RateLimit({ count: 2, window: '1m', countOn: 'failure' })
  login(@Args('password', { type: () => String }) password: string) {
    if (password !== 'secret') throw new Error('Wrong password');
    return true;
  }
}

/** An app guard that runs after the rate limit's (a method guard after the global one). */
let closedForMaintenance = false;
class MaintenanceGuard implements CanActivate {
  canActivate(): boolean {
    return !closedForMaintenance;
  }
}

@Resolver()
class ExportResolver {
  /** Only delivered exports count, 2 a minute per client. */
  @Mutation(() => String)
  @UseGuards(MaintenanceGuard)
  @RateLimit({ count: 2, window: '1m', countOn: 'success' })
  export() {
    return 'exported';
  }
}

/** Holds a capped handler until the test opens it; `entered` resolves once one is in. */
const capped = {
  gate: Promise.resolve(),
  open: () => undefined as void,
  entered: Promise.resolve(),
  enter: () => undefined as void,
  close() {
    this.gate = new Promise((resolve) => (this.open = resolve));
    this.entered = new Promise((resolve) => (this.enter = resolve));
  },
  async run<T>(result: () => T): Promise<T> {
    this.enter();
    await this.gate;
    return result();
  },
};

@Resolver()
class ReportResolver {
  /** One report at a time per client. */
  @Mutation(() => String)
  @RateLimit({ concurrency: 1 })
  report(@Args('fail', { type: () => Boolean }) fail: boolean) {
    return capped.run(() => {
      if (fail) throw new Error('report failed');
      return 'reported';
    });
  }
}

@WebSocketGateway()
class UploadGateway {
  /** One scan at a time per client. */
  @SubscribeMessage('scan')
  @RateLimit({ concurrency: 1 })
  scan(): Promise<string> {
    return capped.run(() => 'scanned');
  }

  @SubscribeMessage('guarded-upload')
  @UseGuards(MaintenanceGuard)
  @RateLimit({ count: 2, window: '1m', countOn: 'success' })
  guardedUpload(): string {
    return 'stored';
  }

  /** Only delivered uploads count, 2 a minute per client. */
  @SubscribeMessage('upload')
  @RateLimit({ count: 2, window: '1m', countOn: 'success' })
  upload(): string {
    return 'stored';
  }

  @SubscribeMessage('broken-upload')
  @RateLimit({ name: 'UploadGateway.upload', count: 2, window: '1m', countOn: 'success' })
  brokenUpload(): string {
    throw new WsException('disk full');
  }
}

describeStores('countOn on GraphQL and WebSocket, settled by the handler', (store) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    capped.open();
    closedForMaintenance = false;
    disconnectSockets();
    await app?.close();
    app = undefined;
  });

  async function start(): Promise<void> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
        GraphQLModule.forRoot<ApolloDriverConfig>({ driver: ApolloDriver, autoSchemaFile: true }),
        RateLimitModule.forRoot({ redis: await store.redis(), keyPrefix: uniquePrefix() }),
      ],
      providers: [AccountResolver, ExportResolver, ReportResolver, UploadGateway],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');
  }

  it('a mutation: its error counts, its result is refunded', async () => {
    await start();
    const login = async (password: string) => {
      const { body } = await request(app!.getHttpServer())
        .post('/graphql')
        .send({ query: `mutation { login(password: "${password}") }` });
      return body.data?.login === true ? 'in' : (body.errors[0].extensions.code as string);
    };
    const answers: string[] = [];
    for (let i = 0; i < 5; i += 1) answers.push(await login('secret'));
    answers.push(await login('guess'), await login('secret'), await login('guess'));
    answers.push(await login('secret'));
    expect(answers).toEqual([
      'in',
      'in',
      'in',
      'in',
      'in',
      'INTERNAL_SERVER_ERROR',
      'in',
      'INTERNAL_SERVER_ERROR',
      'RATE_LIMITED',
    ]);
  });

  /** A client of the app: `send` answers with the ack, `limited`, or the exception's message. */
  async function connect(): Promise<(event: string) => Promise<string>> {
    const socket = await connectSocket(await app!.getUrl());
    return async (event) => {
      const answer = await sendMessage<{ message: string; rule?: string }>(socket, event);
      if ('ack' in answer) return answer.ack as string;
      return answer.exception.rule ? 'limited' : answer.exception.message;
    };
  }

  it('a mutation or a message a later guard refuses holds nothing in flight: decided after the guards', async () => {
    await start();
    const exportOnce = async () => {
      const { body } = await request(app!.getHttpServer()).post('/graphql').send({ query: 'mutation { export }' });
      return (body.data?.export as string | undefined) ?? (body.errors[0].extensions.code as string);
    };
    const send = await connect();
    closedForMaintenance = true;
    const refused: string[] = [];
    for (let i = 0; i < 3; i += 1) refused.push(await exportOnce(), await send('guarded-upload'));
    expect(refused).toEqual(Array.from({ length: 3 }, () => ['FORBIDDEN', 'Forbidden resource']).flat());
    closedForMaintenance = false;
    const answers: string[] = [];
    for (let i = 0; i < 3; i += 1) answers.push(await exportOnce(), await send('guarded-upload'));
    expect(answers).toEqual(['exported', 'stored', 'exported', 'stored', 'RATE_LIMITED', 'limited']);
  });

  it('a cap on a mutation and a message: a slot taken while it runs, given back however it ends', async () => {
    await start();
    const report = async (fail: boolean) => {
      const { body } = await request(app!.getHttpServer())
        .post('/graphql')
        .send({ query: `mutation { report(fail: ${fail}) }` });
      return (body.data?.report as string | undefined) ?? (body.errors[0].extensions.code as string);
    };
    const send = await connect();
    const answers: string[] = [];
    for (const fail of [false, true, true, false]) answers.push(await report(fail));
    answers.push(await send('scan'), await send('scan'));
    expect(answers).toEqual([
      'reported',
      'INTERNAL_SERVER_ERROR',
      'INTERNAL_SERVER_ERROR',
      'reported',
      'scanned',
      'scanned',
    ]);
    // One running: the next is refused until it ends.
    capped.close();
    const running = report(false);
    await capped.entered;
    expect(await report(false)).toBe('RATE_LIMITED');
    capped.open();
    expect(await running).toBe('reported');
    expect(await report(false)).toBe('reported');
    // A second client from the same address (one socket tells its answers apart only one at a time).
    const other = await connect();
    capped.close();
    const scanning = send('scan');
    await capped.entered;
    expect(await other('scan')).toBe('limited');
    capped.open();
    expect(await scanning).toBe('scanned');
    expect(await send('scan')).toBe('scanned');
  });

  it('a WebSocket message: its result counts, its error is refunded', async () => {
    await start();
    const send = await connect();
    const answers: string[] = [];
    for (let i = 0; i < 4; i += 1) answers.push(await send('broken-upload'));
    for (let i = 0; i < 3; i += 1) answers.push(await send('upload'));
    expect(answers).toEqual(['disk full', 'disk full', 'disk full', 'disk full', 'stored', 'stored', 'limited']);
  });
});

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ExecutionContext, INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { RateLimit, RateLimitModule } from 'nest-rate-limit';
import type { Socket } from 'socket.io-client';
import ts from 'typescript';
import { afterEach, expect, it } from 'vitest';
import { connectSocket, disconnectSockets, sendMessage } from '../support/socket.js';
import { ROOT } from './package-copy.js';

/**
 * docs/graphql-and-websocket.md, "WebSocket behind a proxy": `by: 'ip'` sees the proxy's address, so every client
 * behind it shares a counter; the doc's `forwardedAddress`, taken from the doc as written, counts
 * each client by the address the proxy appended to `X-Forwarded-For`.
 */

/** The doc's `forwardedAddress` function, compiled from its code block. */
function documentedForwardedAddress(): (context: ExecutionContext) => string {
  const doc = readFileSync(join(ROOT, 'docs/graphql-and-websocket.md'), 'utf8');
  const start = doc.indexOf('function forwardedAddress(');
  if (start < 0) throw new Error('docs/graphql-and-websocket.md has no forwardedAddress function');
  const indent = /[ \t]*$/.exec(doc.slice(0, start))![0];
  const end = doc.indexOf(`\n${indent}}\n`, start) + indent.length + 2;
  const { outputText } = ts.transpileModule(doc.slice(start, end), {
    compilerOptions: { target: ts.ScriptTarget.ES2022 },
  });
  return new Function(`${outputText}\nreturn forwardedAddress;`)() as (context: ExecutionContext) => string;
}

const forwardedAddress = documentedForwardedAddress();

@WebSocketGateway()
class ChatGateway {
  @SubscribeMessage('by-ip')
  @RateLimit({ count: 1, window: '1m' })
  byIp() {
    return 'ok';
  }

  @SubscribeMessage('by-forwarded')
  @RateLimit({ count: 1, window: '1m', by: (context) => forwardedAddress(context) })
  byForwarded() {
    return 'ok';
  }
}

let app: INestApplication | undefined;

afterEach(async () => {
  disconnectSockets();
  await app?.close();
  app = undefined;
});

/** A client whose connection came through a proxy that appended `client` to the header it got. */
const connectThroughProxy = (url: string, forwardedFor: string) =>
  connectSocket(url, { 'x-forwarded-for': forwardedFor });

const send = async (socket: Socket, event: string) => ('ack' in (await sendMessage(socket, event)) ? 'ok' : 'refused');

it('behind a proxy, by: ip counts every client as one; the documented forwardedAddress counts each', async () => {
  const moduleRef = await Test.createTestingModule({
    imports: [RateLimitModule.forRoot({})],
    providers: [ChatGateway],
  }).compile();
  app = moduleRef.createNestApplication({ logger: false });
  await app.listen(0, '127.0.0.1');
  const url = await app.getUrl();
  // Two clients through one proxy (this process's address); the first wrote a header of its own.
  const alice = await connectThroughProxy(url, '10.9.9.9, 203.0.113.1');
  const bob = await connectThroughProxy(url, '203.0.113.2');

  expect(await send(alice, 'by-ip')).toBe('ok');
  expect(await send(bob, 'by-ip')).toBe('refused');

  expect(await send(alice, 'by-forwarded')).toBe('ok');
  expect(await send(bob, 'by-forwarded')).toBe('ok');
  expect(await send(alice, 'by-forwarded')).toBe('refused');
  // Counted by the entry the proxy appended, not the one the client wrote (alice's, again here).
  const forger = await connectThroughProxy(url, '10.9.9.9, 203.0.113.3');
  expect(await send(forger, 'by-forwarded')).toBe('ok');
});

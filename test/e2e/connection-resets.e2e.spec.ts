import {
  Controller,
  Get,
  type INestApplication,
  Injectable,
  type MiddlewareConsumer,
  Module,
  type NestMiddleware,
  type NestModule,
} from '@nestjs/common';
import { mkdtempSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { type AddressInfo, type Socket, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { LogCapture } from '../support/log-capture.js';
import { describePlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

@Controller('by-address')
class AddressController {
  /** Counted per client address (the default `by: 'ip'`), so each request needs one. */
  @Get()
  @RateLimit({ count: 1_000, window: '1m' })
  get() {
    return { ok: true };
  }
}

/** The statuses the app gave its responses, as the server sees them (a reset client reads none). */
function recordStatuses(app: INestApplication): number[] {
  const statuses: number[] = [];
  const server = app.getHttpServer() as {
    on(event: 'request', listener: (req: unknown, res: ResponseLike) => void): void;
  };
  server.on('request', (_, res) => res.once('close', () => statuses.push(res.statusCode)));
  return statuses;
}

interface ResponseLike {
  statusCode: number;
  once(event: 'close', listener: () => void): void;
}

/** Client sockets of this process by the `x-client` header of their request. */
const clients = new Map<string, Socket>();

/**
 * Resets the connection of the request it is given from the client's side, right after the server
 * read the request and before the app decides it: the race a client resetting right after its
 * request meets under load, made certain. The reset is in the kernel at once (loopback), and Node
 * reads it only at its next turn for I/O.
 */
@Injectable()
class ClientResetsNow implements NestMiddleware {
  use(req: { headers: Record<string, string | string[] | undefined> }, _res: unknown, next: () => void) {
    clients.get(String(req.headers['x-client']))?.resetAndDestroy();
    next();
  }
}

@Module({})
class ClientResetsModule implements NestModule {
  configure(consumer: MiddlewareConsumer) {
    consumer.apply(ClientResetsNow).forRoutes('by-address');
  }
}

/** Sends a request on a raw socket, which `ClientResetsNow` resets once the server has read it. */
function resetRequest(port: number, path: string, id: string): Promise<void> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () => {
      clients.set(id, socket);
      socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-client: ${id}\r\n\r\n`);
    });
    const done = () => {
      clients.delete(id);
      resolve();
    };
    socket.on('error', done);
    socket.on('close', done);
  });
}

const UNIX_SOCKET_ADVICE = /Unix socket/;

describePlatforms('a client that resets its connection has gone: no warning about a Unix socket', (platform) => {
  let app: INestApplication;
  const logs = new LogCapture();

  beforeAll(async () => {
    app = await createTestApp({
      platform,
      controllers: [AddressController],
      imports: [ClientResetsModule],
      rateLimit: { keyPrefix: uniquePrefix() },
      logger: logs,
    });
    await app.listen(0, '127.0.0.1');
  });

  afterAll(async () => {
    await app?.close();
  });

  it('requests whose clients reset before the decision: refused as closed connections (499), not 500, and nothing logged', async () => {
    const statuses = recordStatuses(app);
    const { port } = (app.getHttpServer() as { address(): AddressInfo }).address();
    const before = logs.lines.length;
    await Promise.all(Array.from({ length: 20 }, (_, i) => resetRequest(port, '/by-address', `${platform}-${i}`)));
    // The socket still looks open, but its peer has no address any more: a client gone, not a
    // server without client addresses. (Fastify reads the address before the middleware, so its
    // requests are decided on it as usual: 200, an answer nobody reads.)
    expect(statuses).toHaveLength(20);
    expect(statuses.filter((status) => status !== 499 && status !== 200)).toEqual([]);
    if (platform === 'express') expect(statuses).toEqual(Array.from({ length: 20 }, () => 499));
    expect(logs.at('warn', UNIX_SOCKET_ADVICE)).toEqual([]);
    expect(logs.lines.slice(before).filter((line) => line.context === 'RateLimit')).toEqual([]);
  });
});

describePlatforms('a server listening on a Unix socket, without trust proxy, has no client addresses', (platform) => {
  let app: INestApplication | undefined;
  let dir: string;
  const logs = new LogCapture();

  afterEach(async () => {
    await app?.close();
    app = undefined;
    rmSync(dir, { recursive: true, force: true });
  });

  it('its requests are refused with 500, and the misconfiguration is said once, naming the Unix socket', async () => {
    dir = mkdtempSync(join(tmpdir(), 'rl-unix-'));
    const socketPath = join(dir, 'app.sock');
    app = await createTestApp({
      platform,
      controllers: [AddressController],
      rateLimit: { keyPrefix: uniquePrefix() },
      logger: logs,
    });
    await app.listen(socketPath);
    const get = () =>
      new Promise<number>((resolve, reject) => {
        httpRequest({ socketPath, path: '/by-address' }, (response) => {
          response.resume();
          response.on('end', () => resolve(response.statusCode ?? 0));
        })
          .on('error', reject)
          .end();
      });
    expect([await get(), await get(), await get()]).toEqual([500, 500, 500]);
    expect(logs.at('warn', UNIX_SOCKET_ADVICE)).toHaveLength(1);
  });
});

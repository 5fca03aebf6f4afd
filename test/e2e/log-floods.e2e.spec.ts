import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import request from 'supertest';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { LogCapture } from '../support/log-capture.js';
import { describePlatforms, sharedRedis } from '../support/matrix.js';
import type { RedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { burst, sequential } from '../support/traffic.js';

const byTenant = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-tenant'];

@Controller('flood')
class FloodController {
  @Get('ip')
  @RateLimit({ count: 5, window: '1m' })
  byIp() {
    return { ok: true };
  }

  @Get('tenant')
  @RateLimit({ count: 5, window: '1m', by: byTenant })
  byTenant() {
    return { ok: true };
  }
}

/** Sends a request on a raw socket, then ends the connection as `how` says, without reading the answer. */
function rawRequest(port: number, path: string, how: 'reset' | 'half-close'): Promise<void> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`, () => {
        if (how === 'reset') socket.resetAndDestroy();
        else socket.end();
      });
    });
    socket.on('error', () => resolve());
    socket.on('close', () => resolve());
    socket.resume();
  });
}

/** Lines of every level the app wrote, but Nest's own start-up lines. */
const written = (logs: LogCapture) =>
  logs.lines.filter(
    (line) => !['NestFactory', 'InstanceLoader', 'RoutesResolver', 'RouterExplorer'].includes(line.context ?? ''),
  );

describePlatforms('nothing a client does writes a log line of its own', (platform) => {
  let server: RedisServer;
  let app: INestApplication;
  let port: number;
  const logs = new LogCapture();

  beforeAll(async () => {
    server = await sharedRedis();
    app = await createTestApp({
      platform,
      controllers: [FloodController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix(), storeErrors: { timeoutMs: 50 } },
      logger: logs,
      trustProxy: true,
    });
    await app.listen(0, '127.0.0.1');
    port = (app.getHttpServer().address() as AddressInfo).port;
  });

  afterAll(async () => {
    await app?.close();
  });

  it('2,000 requests reset or half-closed at once: no 500, no ERROR, a bounded number of lines', async () => {
    const before = written(logs).length;
    for (let batch = 0; batch < 20; batch += 1) {
      await Promise.all(
        Array.from({ length: 100 }, (_, i) => rawRequest(port, '/flood/ip', i % 2 === 0 ? 'reset' : 'half-close')),
      );
    }
    const lines = written(logs).slice(before);
    expect(lines.filter((line) => line.level === 'error')).toEqual([]);
    // Rejections are sampled: a few lines at most for one client.
    expect(lines.length).toBeLessThanOrEqual(5);
    // And the service is fine afterwards.
    await request(app.getHttpServer()).get('/flood/tenant').set('x-tenant', 'after-resets').expect(200);
  });

  it('hostile headers (junk forwarded addresses, huge and odd identities) write a bounded number of lines', async () => {
    const before = written(logs).length;
    const hostile = [
      { 'x-forwarded-for': 'not an address' },
      { 'x-forwarded-for': '999.999.999.999, ::zz' },
      { 'x-forwarded-for': 'a'.repeat(4_000) },
      { 'x-tenant': '{braces}:and:colons' },
      { 'x-tenant': 'x'.repeat(4_000) },
      { 'x-tenant': '' },
      { 'x-tenant': 'caf\u00e9 \u00e8' },
    ];
    const { statuses } = await burst(700, (i) =>
      request(app.getHttpServer())
        .get(i % 2 === 0 ? '/flood/ip' : '/flood/tenant')
        .set(hostile[i % hostile.length]),
    );
    expect(statuses.filter((status) => status >= 500)).toEqual([]);
    const lines = written(logs).slice(before);
    expect(lines.filter((line) => line.level === 'error')).toEqual([]);
    expect(lines.length).toBeLessThanOrEqual(20);
  });

  it('a Redis outage under traffic writes a few sampled lines whose counts add up, not one per request or transition', async () => {
    const before = written(logs).length;
    process.kill(server.pid, 'SIGSTOP');
    try {
      // 3 s of traffic from 20 clients at a time: about 12 open/half-open cycles of the breaker,
      // hundreds of failed calls.
      await sequential(5_000, (i) => request(app.getHttpServer()).get('/flood/tenant').set('x-tenant', `outage-${i}`), {
        clients: 20,
        durationMs: 3_000,
      });
    } finally {
      process.kill(server.pid, 'SIGCONT');
    }
    await app.close();
    const lines = written(logs).slice(before);
    const circuit = lines.filter((line) => /Redis circuit/.test(line.message));
    const count = (pattern: RegExp) =>
      circuit
        .filter((line) => pattern.test(line.message))
        .reduce((sum, line) => sum + Number(/: (\d+) since last report/.exec(line.message)?.[1] ?? 0), 0);
    expect(count(/circuit open/)).toBeGreaterThanOrEqual(2);
    // Every half-open follows an open: the counts add up to the transitions, none lost.
    expect(Math.abs(count(/circuit open/) - count(/circuit half-open/))).toBeLessThanOrEqual(1);
    expect(circuit.length).toBeLessThanOrEqual(9);
    // Store failures: at most one line a second, plus the closing report.
    expect(lines.filter((line) => /store failed/.test(line.message)).length).toBeLessThanOrEqual(6);
    expect(lines.length).toBeLessThanOrEqual(20);
  });
});

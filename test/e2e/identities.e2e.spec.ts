import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { rateLimitKey, rateLimitKeys } from 'nest-rate-limit/store';
import { LogCapture } from '../support/log-capture.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

/** The identity is whatever the client puts in `?u=`; `?none` gives undefined, `?null` gives null. */
function fromQuery(context: ExecutionContext): string {
  const query = context.switchToHttp().getRequest<{ query: Record<string, string> }>().query;
  if ('none' in query) return undefined as unknown as string;
  if ('null' in query) return null as unknown as string;
  return query.u;
}

@Controller('who')
class WhoController {
  @Get()
  @RateLimit({ name: 'who', count: 1, window: '1h', by: fromQuery })
  get() {
    return {};
  }
}

const hostile = [
  '{slot}',
  'a}b{c',
  '{}',
  'line\nbreak',
  '\r\n\r\nHTTP/1.1 200 OK',
  'x'.repeat(10_000),
  'ünïcödé 🚦',
  'with space',
  'rl:{x}:who:fw',
  '#notadigest',
  '~anonymous',
  'plain-id',
  'PLAIN-ID',
];

describe('hostile identities', () => {
  let server: RedisServer;
  let redis: Redis;
  let app: INestApplication;
  const prefix = uniquePrefix();
  const logs = new LogCapture();

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    app = await createTestApp({
      controllers: [WhoController],
      // With the marker (off by default), so every key beside a counter is held to the same shape.
      rateLimit: { redis: server.url, keyPrefix: prefix, failover: { marker: 0.8 } },
      logger: logs,
    });
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  it('never collide, never fail with 500, and keep every key small with a slot the library chose', async () => {
    const http = request(app.getHttpServer());
    // Limit 1: each identity's first request is admitted only if no other identity shares its counter.
    const send = (i: number) => http.get('/who').query({ u: hostile[i] });
    expect((await sequential(hostile.length, send)).statuses).toEqual(hostile.map(() => 200));
    expect((await sequential(hostile.length, send)).statuses).toEqual(hostile.map(() => 429));
    const all = await redis.keys(`${prefix}:*`);
    // A counter per identity, and its marker (limit 1: the window is full at once).
    const layout = hostile.map((identity) => rateLimitKeys(prefix, 'who', identity, 'fixed-window'));
    const keys = all.filter((key) => layout.some((documented) => documented.key === key));
    expect(keys).toHaveLength(hostile.length);
    expect(all).toHaveLength(2 * hostile.length);
    expect([...all].sort()).toEqual(layout.flatMap(({ key, markerKey }) => [key, markerKey]).sort());
    for (const key of all) {
      expect(key.length).toBeLessThanOrEqual(120);
      expect(key).toMatch(new RegExp(`^${prefix}:\\{[A-Za-z0-9._:#~/-]+\\}:who:(fw|mark)$`));
      expect(key).not.toMatch(/[\s\r\n]/);
    }
  });

  it('counts requests without an identity in one explicit anonymous counter, warning once', async () => {
    const http = request(app.getHttpServer());
    await http.get('/who').query({ none: '' }).expect(200);
    await http.get('/who').query({ null: '' }).expect(429);
    await http.get('/who').query({ u: '' }).expect(429);
    expect(await redis.exists(rateLimitKey(prefix, 'who', null, 'fixed-window'))).toBe(1);
    // A client claiming the literal identity '~anonymous' got a counter of its own (tested above).
    expect(logs.at('warn', /'by' returned/)).toHaveLength(1);
    expect(logs.at('warn', /'by' returned/)[0]).toContain("share one '~anonymous' counter of rule who");
    expect(logs.at('error')).toEqual([]);
  });
});

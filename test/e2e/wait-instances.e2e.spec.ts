import { Controller, Get, type INestApplication } from '@nestjs/common';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Which instance ran each admitted request, in the order they ran. */
const ran: string[] = [];

@Controller('shared')
class SharedController {
  @Get()
  @RateLimit({ count: 10, window: '1s', by: 'global', wait: { maxMs: '12s' } })
  run() {
    return {};
  }
}

describe('waiting across two instances of one Redis', () => {
  let server: RedisServer;
  const apps: { app: INestApplication; url: string }[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    const prefix = uniquePrefix();
    for (const name of ['a', 'b']) {
      const app = await createTestApp({
        controllers: [SharedController],
        rateLimit: { redis: server.url, keyPrefix: prefix },
      });
      await app.listen(0, '127.0.0.1');
      const { port } = app.getHttpServer().address() as AddressInfo;
      apps.push({ app, url: `http://127.0.0.1:${port}/shared?from=${name}` });
    }
  });

  afterAll(async () => {
    await Promise.all(apps.map(({ app }) => app.close()));
    await server?.stop();
  });

  it('admits both instances’ waiters within the limit, neither starving the other', async () => {
    const sent = apps.flatMap(({ url }, i) =>
      Array.from({ length: 40 }, async () => {
        const response = await fetch(url);
        await response.arrayBuffer();
        if (response.status === 200) ran.push(i === 0 ? 'a' : 'b');
        return response.status;
      }),
    );
    expect(await Promise.all(sent)).toEqual(Array(80).fill(200));
    // In the first half of the admissions, each instance had a fair part.
    const firstHalf = ran.slice(0, 40);
    expect(firstHalf.filter((from) => from === 'a').length).toBeGreaterThanOrEqual(10);
    expect(firstHalf.filter((from) => from === 'b').length).toBeGreaterThanOrEqual(10);
  }, 30_000);
});

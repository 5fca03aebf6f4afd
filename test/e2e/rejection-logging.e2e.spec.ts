import { Controller, Get } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { LogCapture } from '../support/log-capture.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential } from '../support/traffic.js';

@Controller('attacked')
class AttackedController {
  @Get()
  @RateLimit({ count: 1, window: '1m' })
  get() {
    return {};
  }
}

describe('rejections under attack are logged by sampling', () => {
  let server: RedisServer;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterAll(() => server?.stop());

  it('turns 1,000 rejections of one client into a few lines whose counts add up to 1,000', async () => {
    const logs = new LogCapture();
    const app = await createTestApp({
      controllers: [AttackedController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix() },
      logger: logs,
    });
    const http = request(app.getHttpServer());
    await http.get('/attacked').expect(200);
    // 1,000 more, 25 in flight at a time.
    const { statuses } = await sequential(1_000, () => http.get('/attacked'), { clients: 25 });
    await app.close(); // reports what is still pending

    expect(statuses.filter((s) => s === 429)).toHaveLength(1_000);
    const lines = logs.at('warn', /Rejected by rule AttackedController\.get/);
    expect(lines.length).toBeGreaterThanOrEqual(1);
    expect(lines.length).toBeLessThanOrEqual(3);
    const reported = lines.reduce((sum, line) => sum + Number(/: (\d+) since last report$/.exec(line)![1]), 0);
    expect(reported).toBe(1_000);
    expect(logs.lines.filter((line) => line.level === 'warn')).toHaveLength(lines.length);
  });
});

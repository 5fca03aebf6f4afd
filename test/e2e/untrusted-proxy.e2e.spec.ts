import { Controller, Get, type INestApplication } from '@nestjs/common';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { Test } from '@nestjs/testing';
import type { Request } from 'express';
import { RateLimit, RateLimitModule } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, describe, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describePlatforms } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { sequential, statuses } from '../support/traffic.js';

@Controller()
class ProxiedController {
  @Get('limited')
  @RateLimit({ count: 3, window: '1m' })
  limited() {
    return 'limited';
  }
}

const PROXY_WARNING = /trusts no proxy/;
const SETTING = {
  express: "set Express's 'trust proxy' (app.set('trust proxy', 1) behind one proxy)",
  fastify: "set Fastify's 'trustProxy' (new FastifyAdapter({ trustProxy: 1 }) behind one proxy)",
};

describePlatforms('requests through a proxy the app does not trust', (platform) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(trustProxy: boolean): Promise<LogCapture> {
    const logs = new LogCapture();
    app = await createTestApp({
      platform,
      trustProxy,
      logger: logs,
      controllers: [ProxiedController],
      rateLimit: { keyPrefix: uniquePrefix() },
    });
    return logs;
  }

  it('are warned of once, naming the setting of the adapter, and counted as before: by the address they come from', async () => {
    const logs = await start(false);
    // Forwarded for 50 different clients: all have the proxy's (this host's) address, one bucket.
    const server = app!.getHttpServer();
    const answers = await sequential(50, (i) =>
      request(server)
        .get('/limited')
        .set('X-Forwarded-For', `198.51.100.${i + 1}`),
    );
    expect(answers.statuses).toEqual([200, 200, 200, ...Array.from({ length: 47 }, () => 429)]);
    const warnings = logs.at('warn', PROXY_WARNING);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain('Requests carry X-Forwarded-For');
    expect(warnings[0]).toContain(SETTING[platform]);
  });

  it('the standard Forwarded header too', async () => {
    const logs = await start(false);
    expect(await statuses(app!, '/limited', 5, { Forwarded: 'for=198.51.100.7' })).toEqual([200, 200, 200, 429, 429]);
    expect(logs.at('warn', PROXY_WARNING)).toEqual([expect.stringContaining('Requests carry Forwarded')]);
  });

  it('say nothing when the app trusts a proxy, or when no request carries the header', async () => {
    const trusting = await start(true);
    expect(await statuses(app!, '/limited', 5, { 'X-Forwarded-For': '198.51.100.7' })).toEqual([
      200, 200, 200, 429, 429,
    ]);
    // Trusted: the client the proxy names is counted, not the proxy.
    expect(await statuses(app!, '/limited', 1, { 'X-Forwarded-For': '198.51.100.8' })).toEqual([200]);
    expect(trusting.at('warn', PROXY_WARNING)).toEqual([]);
    await app!.close();

    const direct = await start(false);
    expect(await statuses(app!, '/limited', 20)).toEqual([200, 200, 200, ...Array.from({ length: 17 }, () => 429)]);
    expect(direct.at('warn', PROXY_WARNING)).toEqual([]);
  });
});

describe('an address the app gives its requests itself (Express)', () => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it("is the one counted: a middleware's own `ip` on the request, whatever 'trust proxy' says", async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ keyPrefix: uniquePrefix() })],
      controllers: [ProxiedController],
    }).compile();
    app = moduleRef.createNestApplication<NestExpressApplication>({ logger: false });
    // As an app behind a CDN does: the client's address from a header only its edge sets.
    app.use((req: Request, _res: unknown, next: () => void) => {
      Object.defineProperty(req, 'ip', { value: req.headers['x-edge-client'] });
      next();
    });
    await app.init();
    expect(await statuses(app, '/limited', 4, { 'X-Edge-Client': '203.0.113.1' })).toEqual([200, 200, 200, 429]);
    // Another client behind the same edge, on the same connection address: its own bucket.
    expect(await statuses(app, '/limited', 1, { 'X-Edge-Client': '203.0.113.2' })).toEqual([200]);
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
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

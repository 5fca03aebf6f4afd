import { Controller, Get, type INestApplication, ServiceUnavailableException } from '@nestjs/common';
import { RateLimit, RateLimitConfigurationError } from 'nest-rate-limit';
import { RateLimitManagementService, MemoryConfigCentre, rateLimitManagement } from 'nest-rate-limit/live';
import request from 'supertest';
import { afterEach, expect, it } from 'vitest';
import { LogCapture } from '../support/log-capture.js';
import { describeStores } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

function brokenIdentity(): string {
  throw new ServiceUnavailableException('the identity service is down');
}

@Controller('shadow')
class ShadowController {
  /** A limit being tried: 2 per minute, never enforced. */
  @Get('tried')
  @RateLimit({ count: 2, window: '1m', mode: 'shadow', by: 'global' })
  tried() {
    return {};
  }

  /** An enforced limit (3) and a tighter one being tried (1) on one route. */
  @Get('both')
  @RateLimit({ name: 'both-enforced', count: 3, window: '1m', by: 'global' })
  @RateLimit({ name: 'both-shadow', count: 1, window: '1m', by: 'global', mode: 'shadow' })
  both() {
    return {};
  }

  /** An enforced limit (2) and a looser one being tried (100): the shadow must count only what is admitted. */
  @Get('loose')
  @RateLimit({ name: 'loose-enforced', count: 2, window: '1m', by: 'global' })
  @RateLimit({ name: 'loose-shadow', count: 100, window: '1m', by: 'global', mode: 'shadow', blockFor: '1h' })
  loose() {
    return {};
  }

  /** Enforced unless its config key says otherwise. */
  @Get('live')
  @RateLimit({ count: 2, window: '1m', by: 'global', configKey: 'shadow.live' })
  live() {
    return {};
  }

  @Get('off')
  @RateLimit({ count: 1, window: '1m', by: 'global', mode: 'off' })
  off() {
    return {};
  }

  /** Its identity resolver fails: turning the rule off must let requests through. */
  @Get('broken')
  @RateLimit({ count: 5, window: '1m', configKey: 'shadow.broken', by: brokenIdentity })
  broken() {
    return {};
  }
}

/** The would-be rejections the sampled lines of a rule report, summed. */
function reported(logs: LogCapture, rule: string): number {
  return logs
    .at('warn', new RegExp(`^Would reject \\(shadow mode\\) by rule ${rule.replace('.', '\\.')} `))
    .reduce((sum, line) => sum + Number(/: (\d+) since last report$/.exec(line)![1]), 0);
}

describeStores('shadow mode', (store) => {
  let app: INestApplication;
  let logs: LogCapture;

  async function start(extra: Parameters<typeof createTestApp>[0]['rateLimit'] = {}) {
    logs = new LogCapture();
    app = await createTestApp({
      controllers: [ShadowController],
      logger: logs,
      rateLimit: {
        redis: await store.redis(),
        keyPrefix: uniquePrefix(),
        configCentre: MemoryConfigCentre,
        extensions: [rateLimitManagement()],
        ...extra,
      },
    });
    return app.get(RateLimitManagementService);
  }

  afterEach(async () => {
    await app?.close();
  });

  it('never rejects; its would-be rejections are logged by sampling, with counts that add up', async () => {
    await start();
    const answers = [];
    for (let i = 0; i < 10; i += 1) answers.push(await request(app.getHttpServer()).get('/shadow/tried'));
    expect(answers.map((answer) => answer.status)).toEqual(Array(10).fill(200));
    // A rule being tried is invisible to clients.
    expect(answers.every((answer) => answer.headers['ratelimit-limit'] === undefined)).toBe(true);
    await app.close();
    expect(reported(logs, 'ShadowController.tried')).toBe(8);
    expect(logs.at('warn', /^Rejected/)).toEqual([]);
  });

  it('beside an enforced rule: the enforced one decides, and the shadowed one counts only admitted requests', async () => {
    const admin = await start();
    expect(await statuses(app, '/shadow/both', 5)).toEqual([200, 200, 200, 429, 429]);
    expect((await admin.inspect('both-enforced', 'x')).used).toBe(3);
    // Its own refusals counted nothing, and neither did the requests the enforced rule refused.
    expect((await admin.inspect('both-shadow', 'x')).used).toBe(1);

    expect(await statuses(app, '/shadow/loose', 5)).toEqual([200, 200, 429, 429, 429]);
    expect(await admin.inspect('loose-shadow', 'x')).toMatchObject({ used: 2, blockedMs: 0 });
    await app.close();
    // Each request it would refuse, whether or not the enforced rule refused it too.
    expect(reported(logs, 'both-shadow')).toBe(4);
    expect(reported(logs, 'loose-shadow')).toBe(0);
  });

  it('module-wide: no rule without a mode of its own rejects', async () => {
    await start({ mode: 'shadow' });
    expect(await statuses(app, '/shadow/both', 5)).toEqual(Array(5).fill(200));
    expect(await statuses(app, '/shadow/live', 4)).toEqual(Array(4).fill(200));
  });

  it("per config key, live: shadow, then enforce, as the key's mode says", async () => {
    const admin = await start();
    await admin.set('shadow.live', { mode: 'shadow' });
    expect(await statuses(app, '/shadow/live', 4)).toEqual(Array(4).fill(200));
    await admin.set('shadow.live', { mode: 'enforce' });
    expect(await statuses(app, '/shadow/live', 1)).toEqual([429]);
    await admin.set('shadow.live', { mode: null });
    expect(await statuses(app, '/shadow/live', 1)).toEqual([429]);
    await admin.set('shadow.live', { mode: 'off' });
    expect(await statuses(app, '/shadow/live', 3)).toEqual(Array(3).fill(200));
  });

  it("'off' skips the rule: nothing counted, and its resolvers do not run", async () => {
    const admin = await start();
    expect(await statuses(app, '/shadow/off', 3)).toEqual(Array(3).fill(200));
    expect((await admin.inspect('ShadowController.off', 'x')).used).toBe(0);
    expect(await statuses(app, '/shadow/broken', 1)).toEqual([503]);
    await admin.set('shadow.broken', { mode: 'off' });
    expect(await statuses(app, '/shadow/broken', 2)).toEqual([200, 200]);
  });
});

it('refuses a mode that is none, at bootstrap, naming the route and the field', async () => {
  @Controller()
  class BadModeController {
    @Get()
    @RateLimit({ count: 1, window: '1s', mode: 'dry-run' as never })
    handler() {}
  }
  await expect(createTestApp({ controllers: [BadModeController] })).rejects.toThrow(
    new RateLimitConfigurationError(
      `@RateLimit on BadModeController.handler: 'mode' must be one of enforce, shadow, off, got "dry-run"`,
    ),
  );
  await expect(createTestApp({ controllers: [], rateLimit: { mode: 'loud' as never } })).rejects.toThrow(
    /RateLimitModule options: 'mode' must be one of "enforce", "shadow", "off", got "loud"/,
  );
  // A timer longer than Node's 2^31 - 1 ms would fire every millisecond.
  await expect(createTestApp({ controllers: [], rateLimit: { liveConfig: { refreshMs: 2 ** 31 } } })).rejects.toThrow(
    /'liveConfig.refreshMs' must be at most 2147483647 ms/,
  );
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import { describe, expect, it } from 'vitest';
import { RateLimit, RateLimitConfigurationError, RateLimitModule, SkipRateLimit } from 'nest-rate-limit';
import { rateLimitMetrics } from 'nest-rate-limit/ops';
import { ruleKeyId } from 'nest-rate-limit/store';
import request from 'supertest';
import { createTestApp } from '../support/test-app.js';

/** A controller whose one handler carries `@RateLimit(options)`, built per case. */
function controllerWith(options: Record<string, unknown>) {
  @Controller('bad')
  class BadController {
    @Get()
    @RateLimit(options as never)
    handler() {
      return {};
    }
  }
  return BadController;
}

async function bootstrapError(controller: new () => unknown): Promise<Error> {
  let app: INestApplication | undefined;
  try {
    app = await createTestApp({ controllers: [controller] });
  } catch (error) {
    return error as Error;
  } finally {
    await app?.close();
  }
  throw new Error('bootstrap succeeded');
}

describe('bad rule options fail at bootstrap, naming Controller.method and the field', () => {
  it.each([
    ['count', 0],
    ['count', -1],
    ['count', Number.NaN],
    ['count', 2.5],
    ['count', '5'],
    ['count', undefined],
    ['window', '5 parsecs'],
    ['window', 0],
    ['window', -1_000],
    ['window', 1.5],
    ['window', ''],
  ])('rejects %s = %s', async (field, value) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', [field]: value }));
    expect(error).toBeInstanceOf(RateLimitConfigurationError);
    expect(error.message).toContain(`@RateLimit on BadController.handler: '${field}'`);
  });

  it.each([
    ['by', 'cookie'],
    ['configKey', ''],
    ['name', 'has space'],
    ['name', '{slot}'],
  ])('rejects %s = %j', async (field, value) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', [field]: value }));
    expect(error.message).toContain(`@RateLimit on BadController.handler: '${field}'`);
  });

  it.each([
    [{ lease: 1 }, 'must be a whole number of at least 2, got 1'],
    [{ lease: 2.5 }, 'must be a whole number of at least 2, got 2.5'],
    [{ lease: '10' }, 'must be a whole number of at least 2, got "10"'],
    [{ lease: 6 }, 'is more than the rule admits in a window (5), got 6'],
    [{ lease: 2, algorithm: 'gcra' }, "applies only to the 'fixed-window' algorithm, got 2"],
    [{ lease: 2, blockFor: '1m' }, "cannot be combined with 'blockFor', got 2"],
    [{ lease: 2, countOn: 'failure' }, "cannot be combined with 'countOn', got 2"],
  ])('rejects a lease that cannot work: %j', async (options, problem) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', by: 'global', ...options }));
    expect(error.message).toBe(`@RateLimit on BadController.handler: 'lease' ${problem}`);
  });

  it.each([
    [{ wait: 2_000 }, 'wait', 'must be { maxMs, maxQueued? }'],
    [{ wait: {} }, 'wait.maxMs', 'is required: the longest a request may wait for room'],
    [{ wait: { maxMs: 'soon' } }, 'wait.maxMs', "must be a positive duration such as 2000 or '2s'"],
    [{ wait: { maxMs: '2m' } }, 'wait.maxMs', "is longer than the rule's window (a minute for a shorter one"],
    [{ window: '1h', wait: { maxMs: '2h' } }, 'wait.maxMs', "is longer than the rule's window"],
    [
      { window: '1d', wait: { maxMs: '2h' } },
      'wait.maxMs',
      "is longer than the rule's window (a minute for a shorter one, an hour at most: 3600000 ms here)",
    ],
    [{ wait: { maxMs: 500, maxQueued: 0 } }, 'wait.maxQueued', 'must be a whole number of requests from 1 to 10000'],
    [
      { wait: { maxMs: 500, maxQueued: 10_001 } },
      'wait.maxQueued',
      'must be a whole number of requests from 1 to 10000',
    ],
    [{ wait: { maxMs: 500 }, blockFor: '1m' }, 'wait', "cannot be combined with 'blockFor'"],
    [{ wait: { maxMs: 500 }, lease: 2 }, 'wait', "cannot be combined with 'lease'"],
    [{ wait: { maxMs: 500 }, countOn: 'failure' }, 'wait', "cannot be combined with 'countOn'"],
  ])('rejects a wait that cannot work: %j', async (options, field, problem) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', ...options }));
    expect(error.message).toContain(`@RateLimit on BadController.handler: '${field}' ${problem}`);
  });

  it.each([
    [{ concurrency: 0 }, 'concurrency', 'must be a whole number of requests in flight from 1 to 10000, got 0'],
    [{ concurrency: -3 }, 'concurrency', 'must be a whole number of requests in flight from 1 to 10000, got -3'],
    [{ concurrency: 2.5 }, 'concurrency', 'must be a whole number of requests in flight from 1 to 10000, got 2.5'],
    [{ concurrency: 10_001 }, 'concurrency', 'must be a whole number of requests in flight from 1 to 10000, got 10001'],
    [{ concurrency: '5' }, 'concurrency', 'must be a whole number of requests in flight from 1 to 10000, got "5"'],
    [{ concurrency: 5, count: 5 }, 'count', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, window: '1s' }, 'window', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, algorithm: 'gcra' }, 'algorithm', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, blockFor: '1m' }, 'blockFor', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, lease: 2 }, 'lease', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, countOn: 'failure' }, 'countOn', "does not apply to a 'concurrency' cap"],
    [{ concurrency: 5, cost: 6 }, 'cost', 'is more than the rule admits at once (5)'],
    [{}, 'count', "must be a positive whole number (or 'concurrency' for a cap on requests in flight), got undefined"],
    [{ wait: { maxMs: 500 } }, 'wait', "needs a limit to wait for: 'count' and 'window', or 'concurrency'"],
  ])('rejects a concurrency cap that cannot work: %j', async (options, field, problem) => {
    const error = await bootstrapError(controllerWith(options));
    expect(error.message).toContain(`@RateLimit on BadController.handler: '${field}' ${problem}`);
  });

  it.each([
    [
      ['kube-probe'],
      "'allow.userAgents[0]' is a user agent alone, which any client can send; give the networks it comes from: { agent: 'kube-probe', from: ['10.0.0.0/8'] }",
    ],
    [
      [{ agent: 'kube-probe' }],
      "'allow.userAgents[0].from' must be the networks the user agent comes from, at least one",
    ],
    [[{ agent: 'kube-probe', from: ['::/0'] }], "'allow.userAgents[0].from[0]' is every address"],
    [
      [{ agent: 'kube-probe', from: ['10.0.0.0/8'], via: 'x' }],
      "'allow.userAgents[0].via' is not a field of an allowed user agent",
    ],
  ])('rejects a user agent that any client could claim: %j', async (userAgents, problem) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', allow: { userAgents } }));
    expect(error.message).toContain(`@RateLimit on BadController.handler: ${problem}`);
  });

  const settled = () => 1;
  it.each([
    [{ settleCost: { actual: settled } }, "'settleCost.max' is required"],
    [{ maxCost: 5 }, "'maxCost' is now 'settleCost.max' (0.3)"],
    [{ settleCost: { actual: settled, max: 0 } }, "'settleCost.max' must be a positive whole number or a function"],
    [
      { settleCost: { actual: settled, max: 2 }, cost: 3 },
      "'settleCost.max' is less than the reservation ('cost': 3), got 2",
    ],
    [{ settleCost: { actual: settled, max: 5 }, countOn: 'success' }, "'settleCost' cannot be combined with 'countOn'"],
    [
      { settleCost: { actual: 5, max: 5 } },
      "'settleCost.actual' must be a function of the handler's result and the context",
    ],
    [{ settleCost: settled }, "'settleCost' must be { actual, max }"],
  ])('rejects a settleCost that cannot work: %j', async (options, problem) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', ...options }));
    expect(error.message).toContain(`@RateLimit on BadController.handler: ${problem}`);
  });

  it.each([
    [{ tiers: { pro: 5 }, tier: () => 'pro' }, "'tier' is now 'tiers.of' (0.3)"],
    [{ tiers: { of: () => 'pro', limits: {} } }, "'tiers.limits' must name at least one tier"],
    [{ tiers: { of: () => 'pro', limits: { 'a:b': 5 } } }, "'tiers.limits.a:b' is not a tier name"],
  ])('rejects tiers that cannot work: %j', async (options, problem) => {
    const error = await bootstrapError(controllerWith({ count: 5, window: '1s', ...options }));
    expect(error.message).toContain(`@RateLimit on BadController.handler: ${problem}`);
  });

  it('names a class rule by its controller and lists every problem at once', async () => {
    @Controller('bad-class')
    @RateLimit({ count: 0, window: '1s' })
    class BadClassController {
      @Get()
      @RateLimit({ count: 1, window: 'soon' })
      handler() {
        return {};
      }
    }
    const error = await bootstrapError(BadClassController);
    expect(error.message).toContain("@RateLimit on BadClassController: 'count' must be a positive whole number, got 0");
    expect(error.message).toContain("@RateLimit on BadClassController.handler: 'window'");
  });

  it('rejects two rules with one name on a handler, and @SkipRateLimit names that match no rule', async () => {
    @Controller('dup')
    class DuplicateController {
      @Get()
      @RateLimit(1, '1s')
      @RateLimit(2, '1m')
      handler() {
        return {};
      }

      @Get('skip')
      @RateLimit({ name: 'real', count: 1, window: '1s' })
      @SkipRateLimit('typo')
      skip() {
        return {};
      }
    }
    const error = await bootstrapError(DuplicateController);
    expect(error.message).toContain(
      `@RateLimit on DuplicateController.handler: 'name' "DuplicateController.handler" is used by two rules`,
    );
    expect(error.message).toContain(
      `@SkipRateLimit on DuplicateController.skip: 'ruleNames' ["typo"] match no rule here`,
    );
  });

  it('rejects two rules whose names have one key id, naming both, as they would share counters', async () => {
    // Two names whose digests share their first 48 bits, found by searching 60 million names.
    const [first, second] = ['collide-11hof', 'collide-l2eq3'];
    expect(ruleKeyId(first)).toBe(ruleKeyId(second));
    @Controller('collide')
    class CollidingController {
      @Get('a')
      @RateLimit({ name: first, count: 1, window: '1s' })
      a() {}
      @Get('b')
      @RateLimit({ name: second, count: 1, window: '1s' })
      b() {}
      @Get('c')
      @RateLimit({ name: 'CollidingController.c.distinct', count: 1, window: '1s' })
      c() {}
    }
    const error = await bootstrapError(CollidingController);
    expect(error).toBeInstanceOf(RateLimitConfigurationError);
    expect(error.message).toBe(
      `@RateLimit on CollidingController.a and on CollidingController.b: the rules named "${first}" and "${second}" ` +
        `have the same key id ${ruleKeyId(first)}, so they would share counters; rename one (give it a 'name')`,
    );
  });

  it('accepts the valid forms: milliseconds, duration strings, positional arguments', async () => {
    @Controller('good')
    class GoodController {
      @Get('a')
      @RateLimit(5, 500)
      a() {}
      @Get('b')
      @RateLimit({ count: 1, window: '1.5m', by: 'global', name: 'b-rule', configKey: 'good.b' })
      b() {}
      @Get('c')
      @RateLimit(10, '1d', 'good.c')
      c() {}
    }
    const app = await createTestApp({ controllers: [GoodController] });
    try {
      const get = (path: string) => request(app.getHttpServer()).get(path);
      // RateLimit-Reset: the seconds left of the window, at most its length (a busy machine may take some).
      const reset = (response: { headers: Record<string, string> }) => Number(response.headers['ratelimit-reset']);
      const a = await get('/good/a').expect(200);
      expect(a.headers['ratelimit-limit']).toBe('5');
      expect(reset(a)).toBeLessThanOrEqual(1);
      const b = await get('/good/b').expect(200);
      expect(b.headers['ratelimit-limit']).toBe('1');
      expect(reset(b)).toBeGreaterThan(60);
      expect(reset(b)).toBeLessThanOrEqual(90);
      await get('/good/b').expect(429);
      const c = await get('/good/c').expect(200);
      expect(c.headers['ratelimit-limit']).toBe('10');
      expect(reset(c)).toBeGreaterThan(86_400 - 60);
      expect(reset(c)).toBeLessThanOrEqual(86_400);
    } finally {
      await app.close();
    }
  });
});

describe('bad module options fail when the module is declared', () => {
  it.each([
    [{ keyPrefix: 'has space' }, 'keyPrefix'],
    [{ keyPrefix: '{tag}' }, 'keyPrefix'],
    [{ storeErrors: { timeoutMs: 0 } }, 'storeErrors.timeoutMs'],
    [{ redisTimeoutMs: 100 }, 'redisTimeoutMs'],
    [{ storeErrors: { policy: 'maybe' } }, 'storeErrors.policy'],
    [{ storeErrors: { polcy: 'deny' } }, 'storeErrors.polcy'],
    [{ logging: { level: 'loud' } }, 'logging.level'],
    [{ logging: { intervalMs: -1 } }, 'logging.intervalMs'],
    [{ memoryStore: { maxKeys: 1.5 } }, 'memoryStore.maxKeys'],
    [{ blockCache: 'yes' }, 'blockCache'],
    [{ blockCache: { maxKeys: 10 } }, 'blockCache.maxKeys'],
    [{ keyAudit: { intervalMs: 60_000 } }, 'keyAudit'],
    [{ storeErrors: { localFallback: { safetyFactor: 2 } } }, 'storeErrors.localFallback.safetyFactor'],
    [{ configCentre: { get: () => undefined } }, 'configCentre'],
  ])('rejects %j', (options, field) => {
    expect(() => RateLimitModule.forRoot(options as never)).toThrow(`RateLimitModule options: '${field}'`);
  });

  it('says where an option of 0.1 went, and lists the fields a group takes', () => {
    expect(() => RateLimitModule.forRoot({ redisTimeoutMs: 100 } as never)).toThrow(
      "RateLimitModule options: 'redisTimeoutMs' is now 'storeErrors.timeoutMs'",
    );
    expect(() => RateLimitModule.forRoot({ storeErrors: { polcy: 'deny' } } as never)).toThrow(
      "'storeErrors.polcy' is no option (known: policy, timeoutMs, circuitBreaker, localFallback, status)",
    );
  });

  it('says what an option 0.3 fixed as a constant now is', () => {
    expect(() => RateLimitModule.forRoot({ logging: { maxLinesPerSecond: 50 } } as never)).toThrow(
      "RateLimitModule options: 'logging.maxLinesPerSecond' is no longer an option (0.3): at most 5 rejection lines a second; only 'level' remains",
    );
    expect(() => RateLimitModule.forRoot({ blockCache: { maxKeys: 10 } } as never)).toThrow(
      "RateLimitModule options: 'blockCache.maxKeys' is no longer an option (0.3): the block cache holds 10000 keys; give blockCache: true or false",
    );
    expect(() => RateLimitModule.forRoot({ blockCache: false, logging: { level: 'debug' } })).not.toThrow();
  });

  it('says which extension an option of 0.3 became, and refuses extensions no extension function made', () => {
    expect(() => RateLimitModule.forRoot({ metrics: true } as never)).toThrow(
      "RateLimitModule options: 'metrics' is now an extension: extensions: [rateLimitMetrics({ registry, prefix }) from 'nest-rate-limit/ops']",
    );
    expect(() => RateLimitModule.forRoot({ extensions: [{ metrics: true }] as never })).toThrow(
      "RateLimitModule options: 'extensions' must be a list of what the extension functions return",
    );
    expect(() => rateLimitMetrics({ prefix: 'rate-limit' })).toThrow(
      `rateLimitMetrics options: 'prefix' must be the start of a Prometheus metric name`,
    );
    expect(() => RateLimitModule.forRoot({ extensions: [rateLimitMetrics({ prefix: 'api_' })] })).not.toThrow();
  });

  it('says what an option 0.3 fixed as a constant now is', () => {
    expect(() => RateLimitModule.forRoot({ storeErrors: { circuitBreaker: { minimumCalls: 5 } } } as never)).toThrow(
      "RateLimitModule options: 'storeErrors.circuitBreaker.minimumCalls' is no longer an option (0.3): the circuit also opens when 30% of the calls of the last 10 s failed, counting 20 calls or more; consecutiveFailures and halfOpenAfterMs remain",
    );
    expect(() =>
      RateLimitModule.forRoot({ storeErrors: { circuitBreaker: { consecutiveFailures: 3, halfOpenAfterMs: 500 } } }),
    ).not.toThrow();
  });
});

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  Controller,
  Get,
  HttpException,
  type INestApplication,
  Injectable,
  type ModuleMetadata,
  type Type,
  UseGuards,
} from '@nestjs/common';
import { APP_GUARD } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import { ThrottlerGuard, ThrottlerModule } from '@nestjs/throttler';
import { RateLimit, RateLimitGuard, RateLimitModule, type RuleDecision } from 'nest-rate-limit';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { ROOT } from './package-copy.js';

/**
 * The differences docs/migrating-from-throttler.md states, measured: the same rule and traffic on
 * `@nestjs/throttler` (its default in-memory storage) and on the embedded store here, on a clock
 * the test moves (throttler reads `Date.now()`, the module its `clock` option). The doc's tables
 * give the figures; a row this suite does not measure the same fails it.
 */

/** The cells of the doc's table row that starts with `label`. */
function documentedRow(label: string): string[] {
  const doc = readFileSync(join(ROOT, 'docs/migrating-from-throttler.md'), 'utf8');
  const row = doc.split('\n').find((line) => line.startsWith(`| ${label} |`));
  if (!row) throw new Error(`docs/migrating-from-throttler.md has no table row '${label}'`);
  return row
    .split('|')
    .slice(2, -1)
    .map((cell) => cell.trim());
}

@Controller()
class ThrottledController {
  @Get('throttled')
  get() {
    return {};
  }
}

@Controller()
class LimitedController {
  @Get('fixed-window')
  @RateLimit({ count: 3, window: '10s' })
  fixedWindow() {
    return {};
  }

  @Get('sliding-log')
  @RateLimit({ count: 3, window: '10s', algorithm: 'sliding-log' })
  slidingLog() {
    return {};
  }

  @Get('fixed-window-blocked')
  @RateLimit({ count: 3, window: '10s', blockFor: '2s' })
  fixedWindowBlocked() {
    return {};
  }

  @Get('sliding-log-blocked')
  @RateLimit({ count: 3, window: '10s', algorithm: 'sliding-log', blockFor: '2s' })
  slidingLogBlocked() {
    return {};
  }
}

/** Both throttlers on every route, each counted per route, as throttler counts them. */
@Controller('per-route')
class PerRouteController {
  @Get('a')
  @RateLimit({ name: 'a.short', count: 2, window: '1m' })
  @RateLimit({ name: 'a.long', count: 3, window: '1h' })
  a() {
    return {};
  }

  @Get('b')
  @RateLimit({ name: 'b.short', count: 2, window: '1m' })
  @RateLimit({ name: 'b.long', count: 3, window: '1h' })
  b() {
    return {};
  }
}

/** The same two as class rules: one budget for the controller's handlers. */
@Controller('per-controller')
@RateLimit({ name: 'short', count: 2, window: '1m' })
@RateLimit({ name: 'long', count: 3, window: '1h' })
class PerControllerController {
  @Get('a')
  a() {
    return {};
  }

  @Get('b')
  b() {
    return {};
  }
}

@Injectable()
class ProblemJsonGuard extends RateLimitGuard {
  protected override createException(rejected: RuleDecision): Error {
    return new HttpException({ title: 'Too Many Requests', rule: rejected.rule.name, waitMs: rejected.resetMs }, 429);
  }
}

@Controller()
class UnguardedController {
  @Get('guarded')
  @RateLimit({ count: 1, window: '1m' })
  get() {
    return {};
  }
}

@Controller()
@UseGuards(ProblemJsonGuard)
class GuardedController {
  @Get('guarded')
  @RateLimit({ count: 1, window: '1m' })
  get() {
    return {};
  }
}

describe('docs/migrating-from-throttler.md, measured', () => {
  let now = 0;
  const apps: INestApplication[] = [];

  async function start(metadata: ModuleMetadata): Promise<INestApplication> {
    const moduleRef = await Test.createTestingModule(metadata).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    apps.push(app);
    return app;
  }

  const throttler = (blockDuration?: number) =>
    start({
      imports: [ThrottlerModule.forRoot({ throttlers: [{ ttl: 10_000, limit: 3, blockDuration }] })],
      controllers: [ThrottledController],
      providers: [{ provide: APP_GUARD, useClass: ThrottlerGuard }],
    });
  const limiter = () =>
    start({
      imports: [RateLimitModule.forRoot({ clock: () => now })],
      controllers: [LimitedController, PerRouteController, PerControllerController],
    });

  /** Requests at the given seconds (a time once per request), on a fresh app: how many were admitted. */
  async function admitted(app: INestApplication, path: string, at: readonly number[]): Promise<number> {
    let count = 0;
    for (const seconds of at) {
      now = 1_000_000 + seconds * 1000;
      vi.setSystemTime(now);
      if ((await request(app.getHttpServer()).get(path)).status === 200) count += 1;
    }
    return count;
  }

  beforeAll(() => {
    // Only Date: the servers' timers stay real.
    vi.useFakeTimers({ toFake: ['Date'] });
  });

  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
  });

  afterAll(() => {
    vi.useRealTimers();
  });

  it('across a window’s end: throttler counts like sliding-log, not like the default fixed-window', async () => {
    const traffic = [0, 9, 9, 10.5, 10.5, 10.5]; // 1 at 0 s, 2 at 9 s, 3 at 10.5 s; 3 per 10 s
    const measured = [
      await admitted(await throttler(), '/throttled', traffic),
      await admitted(await limiter(), '/fixed-window', traffic),
      await admitted(await limiter(), '/sliding-log', traffic),
    ];
    expect(measured).toEqual([4, 6, 4]);
    expect(documentedRow('1 request at 0 s, 2 at 9 s, 3 at 10.5 s')).toEqual(measured.map(String));
  });

  it('when a block ends: throttler starts the count afresh, `blockFor` here leaves it', async () => {
    const traffic = [0, 0, 0, 0, 3]; // 4 at 0 s (the fourth is refused and blocked for 2 s), 1 at 3 s
    const measured = [
      await admitted(await throttler(2_000), '/throttled', traffic),
      await admitted(await limiter(), '/fixed-window-blocked', traffic),
      await admitted(await limiter(), '/sliding-log-blocked', traffic),
    ];
    expect(measured).toEqual([4, 3, 3]);
    expect(documentedRow('4 requests at 0 s, 1 at 3 s, blocked 2 s')).toEqual(measured.map(String));
  });

  it('several named throttlers: rules named per route count per route; class rules are one budget', async () => {
    const app = await limiter();
    const statuses = async (path: string, n: number) => {
      const seen = [];
      for (let i = 0; i < n; i += 1) seen.push((await request(app.getHttpServer()).get(path)).status);
      return seen;
    };
    expect(await statuses('/per-route/a', 3)).toEqual([200, 200, 429]);
    expect(await statuses('/per-route/b', 3)).toEqual([200, 200, 429]);
    expect(await statuses('/per-controller/a', 2)).toEqual([200, 200]);
    expect(await statuses('/per-controller/b', 1)).toEqual([429]);
  });

  it('a createException subclass: not asked behind the module’s global guard; used with globalGuard: false', async () => {
    const refusal = async (globalGuard: boolean, controller: Type, register: 'APP_GUARD' | '@UseGuards') => {
      const app = await start({
        imports: [RateLimitModule.forRoot({ clock: () => now, globalGuard })],
        controllers: [controller],
        providers: register === 'APP_GUARD' ? [{ provide: APP_GUARD, useClass: ProblemJsonGuard }] : [],
      });
      await request(app.getHttpServer()).get('/guarded').expect(200);
      return (await request(app.getHttpServer()).get('/guarded').expect(429)).body as object;
    };
    // The module's guard runs first (global guards run before a controller's) and answers itself.
    expect(await refusal(true, GuardedController, '@UseGuards')).toMatchObject({ retryAfter: 60 });
    const own = { title: 'Too Many Requests', rule: 'UnguardedController.get', waitMs: 60_000 };
    expect(await refusal(false, UnguardedController, 'APP_GUARD')).toEqual(own);
    expect(await refusal(false, GuardedController, '@UseGuards')).toEqual({ ...own, rule: 'GuardedController.get' });
  });
});

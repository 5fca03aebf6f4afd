import { EventEmitter, once } from 'node:events';
import { type FSWatcher, mkdtempSync, readFileSync, rmSync, watch, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  Controller,
  Get,
  type INestApplication,
  Injectable,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
} from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { MemoryConfigCentre, RateLimitConfigCentre, type RateLimitOverride } from 'nest-rate-limit/live';
import { LogCapture } from '../support/log-capture.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

@Controller('tuned')
class TunedController {
  @Get('a')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.a', by: 'global' })
  a() {
    return {};
  }

  @Get('b')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.b', by: 'global' })
  b() {
    return {};
  }

  @Get('c')
  @RateLimit({ count: 2, window: '1m', configKey: 'tuned.c', by: 'global' })
  c() {
    return {};
  }

  @Get('d')
  @RateLimit({ count: 1, window: '1m', configKey: 'tuned.d' })
  d() {
    return {};
  }

  @Get('e')
  @RateLimit({ count: 1, window: '1m', configKey: 'tuned.e' })
  e() {
    return {};
  }
}

describe('thresholds from the config centre', () => {
  let server: RedisServer;
  let app: INestApplication;
  let config: ConfigService;
  const logs = new LogCapture();

  beforeAll(async () => {
    server = await startRedisServer();
    app = await createTestApp({
      controllers: [TunedController],
      rateLimit: { redis: server.url, keyPrefix: uniquePrefix() },
      logger: logs,
    });
    config = app.get(ConfigService);
  });

  afterAll(async () => {
    await app?.close();
    await server?.stop();
  });

  afterEach(() => {
    delete process.env.RATE_LIMIT_TUNED_B_COUNT;
    delete process.env.RATE_LIMIT_TUNED_D_ALLOW;
    delete process.env.RATE_LIMIT_TUNED_E_ALLOW;
  });

  it('takes a changed value on the next request, without a restart (ConfigService.set)', async () => {
    expect(await statuses(app, '/tuned/a', 3)).toEqual([200, 200, 429]);
    config.set('limits.tuned.a.count', 5);
    expect(await statuses(app, '/tuned/a', 4)).toEqual([200, 200, 200, 429]);
    config.set('limits.tuned.a.count', 1);
    const rejected = await request(app.getHttpServer()).get('/tuned/a').expect(429);
    expect(rejected.headers['ratelimit-limit']).toBe('1');
  });

  it('reads env-style names (RATE_LIMIT_<KEY>_COUNT) as they change', async () => {
    process.env.RATE_LIMIT_TUNED_B_COUNT = '3';
    expect(await statuses(app, '/tuned/b', 4)).toEqual([200, 200, 200, 429]);
    process.env.RATE_LIMIT_TUNED_B_COUNT = '4';
    expect(await statuses(app, '/tuned/b', 2)).toEqual([200, 429]);
  });

  it("takes an allow list as it changes: the key's object (ConfigService.set), else the env-style JSON", async () => {
    const probe = { 'User-Agent': 'kube-probe/1.31' };
    // The test's clients come from this host.
    const loopback = ['127.0.0.0/8', '::1'];
    expect(await statuses(app, '/tuned/d', 2, probe)).toEqual([200, 429]);
    process.env.RATE_LIMIT_TUNED_D_ALLOW = JSON.stringify({ userAgents: [{ agent: 'kube-probe', from: loopback }] });
    expect(await statuses(app, '/tuned/d', 3, probe)).toEqual([200, 200, 200]);
    // The key's own object comes first.
    config.set('limits.tuned.d.allow', { userAgents: [{ agent: 'Pingdom', from: loopback }] });
    expect(await statuses(app, '/tuned/d', 1, probe)).toEqual([429]);
    expect(await statuses(app, '/tuned/d', 2, { 'User-Agent': 'Pingdom.com_bot' })).toEqual([200, 200]);
  });

  it('a live user agent holds only from its networks, and one alone is kept out with one warning', async () => {
    const probe = { 'User-Agent': 'kube-probe/1.31' };
    expect(await statuses(app, '/tuned/e', 2, probe)).toEqual([200, 429]);
    // Its networks are not this host's: the header alone lets nothing through.
    config.set('limits.tuned.e.allow', { userAgents: [{ agent: 'kube-probe', from: ['10.0.0.0/8'] }] });
    expect(await statuses(app, '/tuned/e', 2, probe)).toEqual([429, 429]);
    // A user agent alone (as `allow.userAgents=kube-probe` was written before): refused, the decorator's list stays.
    process.env.RATE_LIMIT_TUNED_E_ALLOW = JSON.stringify({ userAgents: ['kube-probe'] });
    config.set('limits.tuned.e.allow', undefined);
    expect(await statuses(app, '/tuned/e', 30, probe)).toEqual(Array.from({ length: 30 }, () => 429));
    const warnings = logs.at('warn', /tuned\.e/);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain("'allow.userAgents[0]' is a user agent alone, which any client can send");
    expect(warnings[0]).toContain("those fields are the decorator's on TunedController.e");
  });

  it('falls back to the decorator field by field on invalid values, warning once per key and values', async () => {
    config.set('limits.tuned.c.count', 'lots');
    config.set('limits.tuned.c.window', '5 parsecs');
    expect(await statuses(app, '/tuned/c', 5)).toEqual([200, 200, 429, 429, 429]);
    const warnings = logs.at('warn', /tuned\.c/);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(
      /of 'tuned.c': 'count' must be a positive whole number, got "lots"; 'window' must be a positive duration.*, got "5 parsecs"; those fields are the decorator's on TunedController.c/,
    );
    // A valid field still applies beside an invalid one.
    config.set('limits.tuned.c.count', 5);
    const answer = await request(app.getHttpServer()).get('/tuned/c');
    expect(answer.headers['ratelimit-limit']).toBe('5');
    expect(answer.headers['ratelimit-reset']).toBe('60');
  });
});

@Injectable()
class MapConfigCentre extends RateLimitConfigCentre {
  readonly values = new Map<string, RateLimitOverride>();
  get(configKey: string) {
    return this.values.get(configKey);
  }
}

describe('a custom config centre', () => {
  let app: INestApplication;

  beforeAll(async () => {
    app = await createTestApp({ controllers: [TunedController], rateLimit: { configCentre: MapConfigCentre } });
  });

  afterAll(() => app?.close());

  it('is created with dependency injection and asked on every request', async () => {
    const centre = app.get(RateLimitConfigCentre);
    expect(centre).toBeInstanceOf(MapConfigCentre);
    (centre as MapConfigCentre).values.set('tuned.a', { count: '1', window: '1h' });
    const first = await request(app.getHttpServer()).get('/tuned/a').expect(200);
    expect(first.headers['ratelimit-reset']).toBe('3600');
    await request(app.getHttpServer()).get('/tuned/a').expect(429);
  });
});

/**
 * The documented example of a provider that pushes changes (docs/live-limits.md, "A config centre of your own"):
 * limits in a JSON file, re-read when the file changes, held in memory between changes, and
 * started and stopped with the app. A Nacos or Apollo client's change listener takes the place
 * of the file watcher.
 */
@Injectable()
class JsonFileConfigCentre extends RateLimitConfigCentre implements OnApplicationBootstrap, OnApplicationShutdown {
  static path = '';
  private values: Record<string, RateLimitOverride> = {};
  private watcher: FSWatcher | undefined;
  readonly loaded = new EventEmitter();

  get(configKey: string): RateLimitOverride | undefined {
    return this.values[configKey];
  }

  onApplicationBootstrap(): void {
    this.load();
    this.watcher = watch(JsonFileConfigCentre.path, () => this.load());
  }

  onApplicationShutdown(): void {
    this.watcher?.close();
  }

  private load(): void {
    try {
      // A new object per key: the limiter checks a rule against each object once.
      this.values = JSON.parse(readFileSync(JsonFileConfigCentre.path, 'utf8')) as Record<string, RateLimitOverride>;
      this.loaded.emit('loaded');
    } catch {
      // Half-written: keep the last values; the write's next event reloads.
    }
  }
}

describe('a config centre that pushes changes (a JSON file watched)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rl-file-centre-'));
  let app: INestApplication;

  beforeAll(async () => {
    JsonFileConfigCentre.path = join(dir, 'limits.json');
    writeFileSync(JsonFileConfigCentre.path, JSON.stringify({ 'tuned.a': { count: 1 } }));
    app = await createTestApp({ controllers: [TunedController], rateLimit: { configCentre: JsonFileConfigCentre } });
  });

  afterAll(async () => {
    await app?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('is started with the app, and its pushed change applies to the next request', async () => {
    expect(await statuses(app, '/tuned/a', 2)).toEqual([200, 429]);
    const centre = app.get(RateLimitConfigCentre) as JsonFileConfigCentre;
    const loaded = once(centre.loaded, 'loaded');
    writeFileSync(JsonFileConfigCentre.path, JSON.stringify({ 'tuned.a': { count: 3 } }));
    await loaded;
    expect(await statuses(app, '/tuned/a', 3)).toEqual([200, 200, 429]);
  });
});

describe('a live centre given as a class', () => {
  it("reads the app's ConfigService beneath the values written to it", async () => {
    const app = await createTestApp({ controllers: [], rateLimit: { configCentre: MemoryConfigCentre } });
    try {
      app.get(ConfigService).set('limits.jobs', { count: 7, window: '1m' });
      const centre = app.get(RateLimitConfigCentre) as MemoryConfigCentre;
      expect(centre.get('jobs')).toEqual({ count: 7, window: '1m' });
      await centre.write('jobs', { count: 9 });
      expect(centre.get('jobs')).toEqual({ count: 9, window: '1m' });
    } finally {
      await app.close();
    }
  });
});

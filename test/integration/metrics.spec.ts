import { readFileSync } from 'node:fs';
import { Controller, Get, type INestApplication } from '@nestjs/common';
import { RateLimit, RateLimiterService } from 'nest-rate-limit';
import { RateLimitManagementService, RedisConfigCentre, rateLimitManagement } from 'nest-rate-limit/live';
import { rateLimitMetrics } from 'nest-rate-limit/ops';
import { RedisService } from 'nest-rate-limit/store';
import { Registry, register } from 'prom-client';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

/** Holds `GET /metered/capped` until the test opens it. */
let cappedGate = Promise.resolve();

@Controller('metered')
class MeteredController {
  @Get('enforced')
  @RateLimit({ name: 'enforced', count: 2, window: '1m', by: 'global' })
  enforced() {
    return {};
  }

  @Get('tried')
  @RateLimit({ name: 'tried', count: 1, window: '1m', by: 'global', mode: 'shadow' })
  tried() {
    return {};
  }

  @Get('capped')
  @RateLimit({ name: 'capped', concurrency: 2, by: 'global' })
  async capped() {
    await cappedGate;
    return {};
  }

  @Get('waited')
  @RateLimit({ name: 'waited', count: 1, window: '300ms', by: 'global', wait: { maxMs: 1_000 } })
  waited() {
    return {};
  }

  @Get('live')
  @RateLimit({ name: 'live', count: 5, window: '1m', by: 'global', configKey: 'metered.live' })
  live() {
    return {};
  }
}

/** One sample of the text exposition format: name, labels, value. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Parses Prometheus's text format as a scraper reads it (comments skipped). */
function parse(text: string): Sample[] {
  return text
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'))
    .map((line) => {
      const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
      if (!match) throw new Error(`Not a sample line: ${line}`);
      const labels: Record<string, string> = {};
      for (const pair of (match[2] ?? '').match(/[a-zA-Z_]\w*="(?:[^"\\]|\\.)*"/g) ?? []) {
        const at = pair.indexOf('=');
        labels[pair.slice(0, at)] = JSON.parse(pair.slice(at + 1)) as string;
      }
      return { name: match[1], labels, value: Number(match[3]) };
    });
}

function value(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  return samples.find(
    (sample) => sample.name === name && Object.entries(labels).every(([label, v]) => sample.labels[label] === v),
  )?.value;
}

describe('Prometheus metrics', () => {
  let server: RedisServer;
  let app: INestApplication | undefined;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  afterAll(() => server?.stop());

  async function start(registry: Registry, extra: object = {}) {
    app = await createTestApp({
      controllers: [MeteredController],
      rateLimit: {
        redis: server.url,
        keyPrefix: uniquePrefix(),
        configCentre: RedisConfigCentre,
        extensions: [rateLimitMetrics({ registry }), rateLimitManagement()],
        ...extra,
      },
    });
    return app;
  }

  it('exposes the documented series with the values of a scripted scenario', async () => {
    const registry = new Registry();
    await start(registry);
    // 2 admitted, then refused by Redis, then by the block cache without a call.
    expect(await statuses(app!, '/metered/enforced', 4)).toEqual([200, 200, 429, 429]);
    // Shadow: never refused; 2 would-be rejections.
    expect(await statuses(app!, '/metered/tried', 3)).toEqual([200, 200, 200]);
    const admin = app!.get(RateLimitManagementService);
    await admin.set('metered.live', { count: 1 });
    await expect(admin.set('metered.live', { count: 'x' })).rejects.toThrow();

    const samples = parse(await registry.metrics());
    const decisions = (rule: string, outcome: string) =>
      value(samples, 'rate_limit_decisions_total', { rule, outcome }) ?? 0;
    expect(decisions('enforced', 'allowed')).toBe(2);
    expect(decisions('enforced', 'rejected')).toBe(2);
    expect(decisions('tried', 'allowed')).toBe(1);
    expect(decisions('tried', 'shadow_rejected')).toBe(2);
    expect(decisions('tried', 'rejected')).toBe(0);
    // The 4th enforced request, and the 3rd shadowed one: their keys were refused until their reset.
    expect(value(samples, 'rate_limit_block_cache_hits_total')).toBe(2);
    // Every call that reached Redis is timed: 3 for the enforced route, 2 for the shadowed one (a
    // request decided again without its only rule, a shadowed one, needs no call).
    expect(value(samples, 'rate_limit_store_duration_seconds_count')).toBe(3 + 2);
    expect(value(samples, 'rate_limit_store_errors_total', { kind: 'timeout' }) ?? 0).toBe(0);
    expect(value(samples, 'rate_limit_circuit_breaker_state', { state: 'closed' })).toBe(1);
    expect(value(samples, 'rate_limit_circuit_breaker_state', { state: 'open' })).toBe(0);
    expect(value(samples, 'rate_limit_config_in_sync')).toBe(1);
    expect(value(samples, 'rate_limit_config_reloads_total')).toBeGreaterThanOrEqual(1);
    expect(value(samples, 'rate_limit_config_refused_total')).toBe(0);
  });

  it("counts each cap's slots this instance holds, at 0 before any traffic", async () => {
    const registry = new Registry();
    await start(registry);
    const slots = async () => value(parse(await registry.metrics()), 'rate_limit_slots_in_flight', { rule: 'capped' });
    expect(await slots()).toBe(0);
    let open: () => void = () => undefined;
    cappedGate = new Promise((resolve) => (open = resolve));
    const server = request(app!.getHttpServer());
    const running = [server.get('/metered/capped').then(), server.get('/metered/capped').then()];
    await until(async () => (await slots()) === 2, { timeoutMs: 2_000, what: 'two slots held' });
    await server.get('/metered/capped').expect(429);
    open();
    expect((await Promise.all(running)).map(({ status }) => status)).toEqual([200, 200]);
    await until(async () => (await slots()) === 0, { timeoutMs: 2_000, what: 'the slots given back' });
  });

  it('times each wait for room of a rule with wait, and only those', async () => {
    const registry = new Registry();
    await start(registry);
    const server = request(app!.getHttpServer());
    await server.get('/metered/waited').expect(200);
    await server.get('/metered/waited').expect(200);
    const samples = parse(await registry.metrics());
    expect(value(samples, 'rate_limit_wait_seconds_count', { rule: 'waited' })).toBe(1);
    expect(value(samples, 'rate_limit_wait_seconds_sum', { rule: 'waited' })).toBeGreaterThan(0.1);
    expect(value(samples, 'rate_limit_wait_seconds_bucket', { rule: 'waited', le: '0.025' })).toBe(0);
  });

  it('registers the metrics docs/operations.md lists, and no other', async () => {
    const registry = new Registry();
    await start(registry);
    const operations = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
    const documented = [...operations.matchAll(/^\| `(rate_limit_\w+)`/gm)].map(([, name]) => name);
    const registered = registry.getMetricsAsArray().map((metric) => (metric as unknown as { name: string }).name);
    expect([...documented].sort()).toEqual([...registered].sort());
  });

  it('has every declared rule with every outcome, and every error kind, at 0 before any traffic', async () => {
    const registry = new Registry();
    await start(registry);
    const outcomes = ['allowed', 'rejected', 'shadow_rejected', 'fallback_allowed', 'fallback_rejected'];
    const before = parse(await registry.metrics());
    // A series must exist before its first count, or rate() and increase() never see that count.
    for (const rule of ['enforced', 'tried', 'live']) {
      for (const outcome of outcomes) {
        expect(value(before, 'rate_limit_decisions_total', { rule, outcome }), `${rule} ${outcome}`).toBe(0);
      }
    }
    for (const kind of ['timeout', 'circuit_open', 'error']) {
      expect(value(before, 'rate_limit_store_errors_total', { kind }), kind).toBe(0);
    }
    expect(value(before, 'rate_limit_block_cache_hits_total')).toBe(0);
    expect(value(before, 'rate_limit_store_duration_seconds_count')).toBe(0);

    // The first burst is an increase from 0, as a scraper computes it.
    expect(await statuses(app!, '/metered/tried', 3)).toEqual([200, 200, 200]);
    const after = parse(await registry.metrics());
    const increase = (outcome: string) =>
      value(after, 'rate_limit_decisions_total', { rule: 'tried', outcome })! -
      value(before, 'rate_limit_decisions_total', { rule: 'tried', outcome })!;
    expect(increase('allowed')).toBe(1);
    expect(increase('shadow_rejected')).toBe(2);

    // A rule given to `consume` as options is known only once used: it appears then, with every outcome.
    await app!.get(RateLimiterService).consume({ name: 'given', count: 5, window: '1m' }, 'someone');
    const given = parse(await registry.metrics());
    for (const outcome of outcomes) {
      const expected = outcome === 'allowed' ? 1 : 0;
      expect(value(given, 'rate_limit_decisions_total', { rule: 'given', outcome }), outcome).toBe(expected);
    }
  });

  it('keeps calls an open circuit refused, which never reached Redis, out of the latency histogram', async () => {
    const own = await startRedisServer();
    const registry = new Registry();
    try {
      app = await createTestApp({
        controllers: [MeteredController],
        rateLimit: {
          redis: own.url,
          keyPrefix: uniquePrefix(),
          extensions: [rateLimitMetrics({ registry })],
          storeErrors: { timeoutMs: 100, circuitBreaker: { consecutiveFailures: 2, halfOpenAfterMs: 60_000 } },
        },
      });
      expect(await statuses(app, '/metered/live', 1)).toEqual([200]);
      process.kill(own.pid, 'SIGSTOP');
      // 2 calls time out and, unanswered a second more, open the circuit; the next 4 are refused
      // at once, never sent.
      await statuses(app, '/metered/live', 2);
      const redis = app.get(RedisService);
      await until(() => redis.runner.circuitState === 'open', { timeoutMs: 5_000, what: 'the circuit opening' });
      await statuses(app, '/metered/live', 4);
      const samples = parse(await registry.metrics());
      const errors = (kind: string) => value(samples, 'rate_limit_store_errors_total', { kind });
      expect(errors('timeout')).toBe(2);
      expect(errors('circuit_open')).toBe(4);
      // The call that was answered, and the two that timed out: Redis's latencies, and nothing else.
      expect(value(samples, 'rate_limit_store_duration_seconds_count')).toBe(1 + 2);
      const fastest = value(samples, 'rate_limit_store_duration_seconds_bucket', { le: '0.025' });
      expect(fastest).toBeLessThanOrEqual(1);
    } finally {
      process.kill(own.pid, 'SIGCONT');
      await app?.close();
      app = undefined;
      await own.stop();
    }
  });

  it('counts what the fallback decides, and store errors by kind, while Redis is out', async () => {
    const own = await startRedisServer();
    const registry = new Registry();
    try {
      app = await createTestApp({
        controllers: [MeteredController],
        rateLimit: {
          redis: own.url,
          keyPrefix: uniquePrefix(),
          extensions: [rateLimitMetrics({ registry, prefix: 'edge_' })],
          storeErrors: { timeoutMs: 50, circuitBreaker: false },
        },
      });
      const redis = app.get(RedisService);
      await until(() => redis.news.instances === 1, { timeoutMs: 5_000, what: 'the instance counted' });
      await own.kill();
      // The 'local' fallback: at most 1.2 x count / instances (2.4: 2) for a key Redis never reported on.
      expect(await statuses(app, '/metered/enforced', 3)).toEqual([200, 200, 429]);
      const samples = parse(await registry.metrics());
      expect(value(samples, 'edge_decisions_total', { rule: 'enforced', outcome: 'fallback_allowed' })).toBe(2);
      expect(value(samples, 'edge_decisions_total', { rule: 'enforced', outcome: 'fallback_rejected' })).toBe(1);
      const errors = samples.filter((sample) => sample.name === 'edge_store_errors_total');
      expect(errors.reduce((sum, sample) => sum + sample.value, 0)).toBe(3);
      expect(errors.every((sample) => ['timeout', 'error', 'circuit_open'].includes(sample.labels.kind))).toBe(true);
      expect(value(samples, 'edge_store_duration_seconds_count')).toBe(3);
    } finally {
      await own.stop();
    }
  });

  it('never has an identity or a key in a label value, even after 10,000 identities', async () => {
    const registry = new Registry();
    await start(registry);
    const limiter = app!.get(RateLimiterService);
    const rule = { name: 'per-user', count: 1, window: '1m' };
    for (let i = 0; i < 10_000; i += 1) {
      const identity = `user-${i}`;
      await limiter.consume(rule, identity);
      if (i % 10 === 0) await limiter.consume(rule, identity);
    }
    const samples = parse(await registry.metrics());
    expect(value(samples, 'rate_limit_decisions_total', { rule: 'per-user', outcome: 'allowed' })).toBe(10_000);
    expect(value(samples, 'rate_limit_decisions_total', { rule: 'per-user', outcome: 'rejected' })).toBe(1_000);
    const allowed = new Set([
      'per-user',
      'enforced',
      'tried',
      'live',
      'capped',
      'waited',
      'allowed',
      'rejected',
      'shadow_rejected',
      'fallback_allowed',
      'fallback_rejected',
      'timeout',
      'error',
      'circuit_open',
      'closed',
      'half-open',
      'open',
    ]);
    const labelValues = new Set(
      samples.flatMap((sample) =>
        Object.entries(sample.labels)
          .filter(([l]) => l !== 'le')
          .map(([, v]) => v),
      ),
    );
    expect([...labelValues].filter((v) => !allowed.has(v))).toEqual([]);
    expect(samples.length).toBeLessThan(100);
  });

  it('registers nothing without the extension, and frees its names when the app closes', async () => {
    app = await createTestApp({ controllers: [MeteredController], rateLimit: { keyPrefix: uniquePrefix() } });
    expect(register.getSingleMetric('rate_limit_decisions_total')).toBeUndefined();
    await app.close();
    // The default registry, twice in one process: the first app's metrics leave with it.
    app = await createTestApp({ controllers: [MeteredController], rateLimit: { extensions: [rateLimitMetrics()] } });
    expect(register.getSingleMetric('rate_limit_decisions_total')).toBeDefined();
    await app.close();
    expect(register.getSingleMetric('rate_limit_decisions_total')).toBeUndefined();
    app = await createTestApp({ controllers: [MeteredController], rateLimit: { extensions: [rateLimitMetrics()] } });
    expect(await statuses(app, '/metered/enforced', 1)).toEqual([200]);
  });
});

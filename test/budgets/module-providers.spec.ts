import { type InjectionToken, Injectable } from '@nestjs/common';
import { ApplicationConfig, ModuleRef, ModulesContainer } from '@nestjs/core';
import { Test, type TestingModule } from '@nestjs/testing';
import { RateLimitModule, type RateLimitModuleOptions, RateLimiterService } from 'nest-rate-limit';
import { MemoryConfigCentre, RateLimitManagementService, rateLimitManagement } from 'nest-rate-limit/live';
import {
  RateLimitHealthIndicator,
  RateLimitKeyAudit,
  rateLimitHealth,
  rateLimitKeyAudit,
  rateLimitMetrics,
} from 'nest-rate-limit/ops';
import { Registry, register } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { uniquePrefix } from '../support/test-app.js';

/**
 * Providers `RateLimitModule.forRoot({ redis })` registers in its own module. A ratchet: today's
 * figure, lowered as the wiring is folded into fewer providers; never raised.
 */
const PROVIDERS_BUDGET = 9;

/** Name of a provider's token as it is printed: a class's name, a string, a symbol's description. */
function tokenName(token: InjectionToken): string {
  if (typeof token === 'function') return token.name;
  if (typeof token === 'symbol') return token.description ?? token.toString();
  // Without the random part Nest adds to some: 'APP_GUARD (UUID: ...)', 'CONFIGURABLE_MODULE_OPTIONS[...]'.
  return String(token).replace(/ \(UUID: .*\)$|\[[0-9a-f]+\]$/, '');
}

describe('budget: providers of the module', () => {
  let server: RedisServer;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterAll(() => server?.stop());

  it('forRoot({ redis }) registers at most its budget of providers', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url })],
    }).compile();
    try {
      // Nest's own view of the module once compiled: the @Module providers and forRoot's merged by
      // token, as the app really holds them; not the ones Nest gives every module (the module
      // itself, ModuleRef, ApplicationConfig).
      const module = [...moduleRef.get(ModulesContainer).values()].find(
        ({ metatype }) => metatype === RateLimitModule,
      )!;
      const nestOwn = new Set<InjectionToken>([RateLimitModule, ModuleRef, ApplicationConfig]);
      const names = [...module.providers.keys()]
        .filter((token) => !nestOwn.has(token))
        .map(tokenName)
        .sort();
      console.log(
        `RateLimitModule.forRoot({ redis }): ${names.length} providers (budget ${PROVIDERS_BUDGET})\n  ${names.join('\n  ')}`,
      );
      expect(names.length).toBeLessThanOrEqual(PROVIDERS_BUDGET);
    } finally {
      await moduleRef.close();
    }
  });
});

/** The classes of the wings, made only for an app that adds their extension. */
const WING_CLASSES = [RateLimitManagementService, RateLimitHealthIndicator, RateLimitKeyAudit] as const;

/** Every provider instance the app holds, in any module. */
function instances(moduleRef: TestingModule): unknown[] {
  return [...moduleRef.get(ModulesContainer).values()].flatMap((module) =>
    [...module.providers.values()].map(({ instance }) => instance as unknown),
  );
}

describe('the wings are optional', () => {
  let server: RedisServer;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterAll(() => server?.stop());

  it('forRoot({ redis }) makes no management, metrics, health or key audit', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url })],
    }).compile();
    await moduleRef.init();
    try {
      for (const wing of WING_CLASSES) {
        expect(() => moduleRef.get(wing, { strict: false }), wing.name).toThrow();
        expect(instances(moduleRef).filter((instance) => instance instanceof wing)).toEqual([]);
      }
      // No metric registered, in prom-client's default registry or elsewhere: a decision is counted nowhere.
      await moduleRef.get(RateLimiterService).consume({ name: 'jobs', count: 5, window: '1m' }, 'worker-1');
      expect(register.getSingleMetric('rate_limit_decisions_total')).toBeUndefined();
      expect(instances(moduleRef).some((instance) => instance?.constructor?.name === 'RateLimitMetrics')).toBe(false);
    } finally {
      await moduleRef.close();
    }
  });

  it('with the extensions, each is made and works', async () => {
    const registry = new Registry();
    const moduleRef = await Test.createTestingModule({
      imports: [
        RateLimitModule.forRoot({
          redis: server.url,
          keyPrefix: uniquePrefix(),
          configCentre: MemoryConfigCentre,
          extensions: [rateLimitManagement(), rateLimitMetrics({ registry }), rateLimitHealth(), rateLimitKeyAudit()],
        }),
      ],
    }).compile();
    await moduleRef.init();
    try {
      expect(await moduleRef.get(RateLimitManagementService).list()).toEqual([]);
      const limiter = moduleRef.get(RateLimiterService);
      const rule = { name: 'jobs', count: 1, window: '1m' };
      expect((await limiter.consume(rule, 'worker-1')).allowed).toBe(true);
      expect((await limiter.consume(rule, 'worker-1')).allowed).toBe(false);
      expect(await registry.getSingleMetricAsString('rate_limit_decisions_total')).toMatch(
        /rate_limit_decisions_total\{rule="jobs",outcome="rejected"\} 1/,
      );
      const { rate_limit: health } = await moduleRef.get(RateLimitHealthIndicator).isHealthy();
      expect(health).toMatchObject({ status: 'up', store: 'redis', redis: 'up' });
      expect((await moduleRef.get(RateLimitKeyAudit).run()).withoutTtl).toEqual([]);
    } finally {
      await moduleRef.close();
    }
  });

  it('forRootAsync takes them beside the factory (useClass here), and makes only those', async () => {
    @Injectable()
    class Options {
      create(): RateLimitModuleOptions {
        return { redis: server.url, keyPrefix: uniquePrefix() };
      }
    }
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRootAsync({ useClass: Options, extensions: [rateLimitHealth()] })],
    }).compile();
    await moduleRef.init();
    try {
      const { rate_limit: health } = await moduleRef.get(RateLimitHealthIndicator).isHealthy();
      expect(health).toMatchObject({ status: 'up', store: 'redis', redis: 'up' });
      expect(() => moduleRef.get(RateLimitManagementService, { strict: false })).toThrow();
    } finally {
      await moduleRef.close();
    }
  });
});

import type { InjectionToken } from '@nestjs/common';
import { ApplicationConfig, ModuleRef, ModulesContainer } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import { RateLimitModule } from 'nest-rate-limit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';

/**
 * Providers `RateLimitModule.forRoot({ redis })` registers in its own module. A ratchet: today's
 * figure, lowered as the wiring is folded into fewer providers; never raised.
 */
const PROVIDERS_BUDGET = 21;

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

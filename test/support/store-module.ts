import type { LoggerService } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  type RateLimitExtension,
  RateLimitModule,
  type RateLimitModuleOptions,
  RateLimiterService,
} from 'nest-rate-limit';
import { RateLimitKeyAudit, rateLimitKeyAudit } from 'nest-rate-limit/ops';
import { type RateLimitAlgorithmName, type RateLimitHit, RateLimitStore, RedisService } from 'nest-rate-limit/store';

/**
 * The library's store as a Nest app builds it (Redis when `options.redis` is set), without HTTP,
 * and the limiter deciding with it; with the key audit, and the `extensions` given. Their log lines
 * go to `logger` (none by default).
 */
export async function createStore(
  options: RateLimitModuleOptions & { extensions?: RateLimitExtension[] },
  logger: LoggerService | false = false,
): Promise<{
  store: RateLimitStore;
  limiter: RateLimiterService;
  redis: RedisService;
  keyAudit: RateLimitKeyAudit;
  close(): Promise<void>;
}> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      RateLimitModule.forRoot({
        logging: false,
        ...options,
        extensions: [rateLimitKeyAudit(), ...(options.extensions ?? [])],
        globalGuard: false,
      }),
    ],
  }).compile();
  moduleRef.useLogger(logger);
  await moduleRef.init();
  return {
    store: moduleRef.get(RateLimitStore),
    limiter: moduleRef.get(RateLimiterService),
    redis: moduleRef.get(RedisService),
    keyAudit: moduleRef.get(RateLimitKeyAudit),
    close: () => moduleRef.close(),
  };
}

/** A hit with defaults: fixed window, cost 1, burst = limit, no block, counted at once. */
export function hit(key: string, overrides: Partial<RateLimitHit> & { limit: number; windowMs: number }): RateLimitHit {
  return {
    key,
    conditional: false,
    algorithm: 'fixed-window' as RateLimitAlgorithmName,
    cost: 1,
    burst: overrides.limit,
    blockMs: 0,
    ...overrides,
  };
}

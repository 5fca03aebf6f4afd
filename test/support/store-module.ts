import { Test } from '@nestjs/testing';
import {
  type RateLimitAlgorithmName,
  type RateLimitHit,
  RateLimitModule,
  type RateLimitModuleOptions,
  RateLimitStore,
  RedisService,
} from 'nest-rate-limit';

/** The library's store as a Nest app builds it (Redis when `options.redis` is set), without HTTP. */
export async function createStore(options: RateLimitModuleOptions): Promise<{
  store: RateLimitStore;
  redis: RedisService;
  close(): Promise<void>;
}> {
  const moduleRef = await Test.createTestingModule({
    imports: [RateLimitModule.forRoot({ logging: false, ...options, globalGuard: false })],
  }).compile();
  moduleRef.useLogger(false);
  await moduleRef.init();
  return { store: moduleRef.get(RateLimitStore), redis: moduleRef.get(RedisService), close: () => moduleRef.close() };
}

/** A hit with defaults: fixed window, cost 1, burst = limit, no block, no marker, counted at once. */
export function hit(key: string, overrides: Partial<RateLimitHit> & { limit: number; windowMs: number }): RateLimitHit {
  return {
    key,
    blockKey: `${key}:block`,
    markerKey: `${key}:mark`,
    markFrom: 0,
    pendingKey: `${key}:pend`,
    conditional: false,
    algorithm: 'fixed-window' as RateLimitAlgorithmName,
    cost: 1,
    burst: overrides.limit,
    blockMs: 0,
    ...overrides,
  };
}

/**
 * CPU cost of one decision on the request path, without HTTP or Redis: the guard with the embedded
 * store, for a rule with and without a configKey, and the parts it is made of.
 *
 *   npm run bench:limiter
 */
import { Controller, type ExecutionContext, Get } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { Test } from '@nestjs/testing';
import { bench, describe } from 'vitest';
import { RateLimit, RateLimitGuard, RateLimitModule } from 'nest-rate-limit';
import { rateLimitKeys } from 'nest-rate-limit/store';

@Controller()
class BenchController {
  @Get('plain')
  @RateLimit({ count: 1_000_000_000, window: '1s' })
  plain() {}

  @Get('tuned')
  @RateLimit({ count: 1_000_000_000, window: '1s', configKey: 'bench.tuned' })
  tuned() {}
}

const moduleRef = await Test.createTestingModule({
  imports: [ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }), RateLimitModule.forRoot({ logging: false })],
  controllers: [BenchController],
}).compile();
const app = moduleRef.createNestApplication({ logger: false });
await app.init();
const guard = app.get(RateLimitGuard);

function context(handler: () => void): () => ExecutionContext {
  return () => {
    const request = { ip: '10.1.2.3', headers: {} };
    const response = { setHeader() {}, header() {} };
    return new ExecutionContextHost([request, response], BenchController, handler);
  };
}
const plain = context(BenchController.prototype.plain);
const tuned = context(BenchController.prototype.tuned);

describe('one decision (embedded store)', () => {
  bench('guard, rule without configKey', async () => {
    await guard.canActivate(plain());
  });
  bench('guard, rule with configKey (4 ConfigService lookups)', async () => {
    await guard.canActivate(tuned());
  });
  bench('building the context alone (baseline)', () => {
    plain();
  });
  bench('rateLimitKey, plain identity', () => {
    rateLimitKeys('rl', 'BenchController.plain', '10.1.2.3', 'fixed-window');
  });
  bench('rateLimitKey, hostile identity (SHA-256)', () => {
    rateLimitKeys('rl', 'BenchController.plain', '{slot}\n'.repeat(20), 'fixed-window');
  });
});

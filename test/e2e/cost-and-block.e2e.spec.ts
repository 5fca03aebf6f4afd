import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { describeStores } from '../support/matrix.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Cost: the upload size in MB, from a header. */
const sizeInMb = (context: ExecutionContext) =>
  Number(context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-size-mb']);

@Controller('features')
class FeaturesController {
  @Get('upload')
  @RateLimit({ count: 10, window: '1m', cost: sizeInMb })
  upload() {
    return {};
  }

  @Get('penalty')
  @RateLimit({ count: 2, window: '1s', blockFor: '10s' })
  penalty() {
    return {};
  }

  @Get('burst')
  @RateLimit({ count: 1, window: '1s', algorithm: 'token-bucket', burst: 3 })
  burst() {
    return {};
  }
}

describeStores('costs, penalties and bursts', (store) => {
  let app: INestApplication;

  beforeAll(async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    app = await createTestApp({
      controllers: [FeaturesController],
      rateLimit: { redis: await store.redis(), keyPrefix: uniquePrefix(), clock: () => Date.now() },
    });
  });

  afterAll(async () => {
    vi.useRealTimers();
    await app?.close();
  });

  it('consumes the cost a function computes, and rejects a cost that does not fit', async () => {
    const http = request(app.getHttpServer());
    const first = await http.get('/features/upload').set('x-size-mb', '4').expect(200);
    expect(first.headers['ratelimit-remaining']).toBe('6');
    await http.get('/features/upload').set('x-size-mb', '4').expect(200);
    const rejected = await http.get('/features/upload').set('x-size-mb', '4').expect(429);
    expect(rejected.headers['ratelimit-remaining']).toBe('2');
    const fits = await http.get('/features/upload').set('x-size-mb', '2').expect(200);
    expect(fits.headers['ratelimit-remaining']).toBe('0');
  });

  it('keeps an identity blocked for blockFor after it passes the limit, with the right Retry-After', async () => {
    const http = request(app.getHttpServer());
    await http.get('/features/penalty').expect(200);
    await http.get('/features/penalty').expect(200);
    expect((await http.get('/features/penalty').expect(429)).headers['retry-after']).toBe('10');
    vi.setSystemTime(Date.now() + 2_000); // the 1 s window is long over, the penalty is not
    expect((await http.get('/features/penalty').expect(429)).headers['retry-after']).toBe('8');
    vi.setSystemTime(Date.now() + 8_000);
    await http.get('/features/penalty').expect(200);
  });

  it('lets a token bucket burst, then refill at its rate', async () => {
    const http = request(app.getHttpServer());
    for (const remaining of ['2', '1', '0']) {
      expect((await http.get('/features/burst').expect(200)).headers['ratelimit-remaining']).toBe(remaining);
    }
    expect((await http.get('/features/burst').expect(429)).headers['retry-after']).toBe('1');
    vi.setSystemTime(Date.now() + 1_000);
    await http.get('/features/burst').expect(200);
    await http.get('/features/burst').expect(429);
  });
});

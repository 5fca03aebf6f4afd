import { Controller, type ExecutionContext, Get, HttpException, type INestApplication } from '@nestjs/common';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitGuard } from 'nest-rate-limit';
import { createTestApp } from '../support/test-app.js';

@Controller('keys')
class KeysController {
  // Both decided after the app's guards, in one call: the first waits for its `by`, which rejects;
  // the second, with a `skipIf`, throws at once for a client that has gone.
  @Get()
  @RateLimit({
    name: 'a',
    count: 5,
    window: '1m',
    by: () => Promise.reject(new Error('no API key')),
  })
  @RateLimit({
    name: 'b',
    count: 5,
    window: '1m',
    skipIf: () => false,
  })
  list() {
    return { ok: true };
  }
}

/** An HTTP request whose connection is gone (no socket), as the guard is handed it. */
function goneRequest(): ExecutionContext {
  const request = { headers: {}, method: 'GET', url: '/keys' };
  const args = [request, {}, undefined];
  return {
    getType: () => 'http',
    getClass: () => KeysController,
    getHandler: () => KeysController.prototype.list,
    getArgs: () => args,
    getArgByIndex: (index: number) => args[index],
    switchToHttp: () => ({ getRequest: () => request, getResponse: () => args[1], getNext: () => undefined }),
  } as unknown as ExecutionContext;
}

describe('a request refused while a rule is still being prepared', () => {
  let app: INestApplication;

  beforeAll(async () => {
    app = await createTestApp({ controllers: [KeysController] });
  });

  afterAll(async () => {
    await app?.close();
  });

  it('is refused with the error that came first, and the other rule’s rejection is not left unhandled', async () => {
    const unhandled: unknown[] = [];
    const listener = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', listener);
    try {
      const guard = app.get(RateLimitGuard);
      const refused = await guard.decideAfterGuards(goneRequest()).catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(HttpException);
      expect((refused as HttpException).getStatus()).toBe(499);
      // Node tells of a rejection nobody handled once the microtasks of its turn have run.
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', listener);
    }
  });
});

import { EventEmitter } from 'node:events';
import { Controller, Get, type INestApplication, Injectable, type Provider, type Type } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { EventPattern, MessagePattern } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { AbstractWsAdapter, SubscribeMessage, WebSocketGateway } from '@nestjs/websockets';
import { afterEach, describe, expect, it } from 'vitest';
import {
  RateLimit,
  RateLimitConfigurationError,
  RateLimitException,
  RateLimitGuard,
  RateLimitModule,
  SkipRateLimit,
} from 'nest-rate-limit';
import { statuses } from '../support/traffic.js';

const NOT_SUPPORTED =
  'only HTTP routes of controllers, GraphQL queries and mutations of resolvers, and @SubscribeMessage handlers of WebSocket gateways are limited';

/**
 * Nest connects gateways before any `onModuleInit`, and without an adapter it loads
 * @nestjs/platform-socket.io (not installed) or exits the process. This one opens no socket.
 */
class NoSocketWsAdapter extends AbstractWsAdapter {
  create(): EventEmitter & { close(done: () => void): void } {
    return Object.assign(new EventEmitter(), { close: (done: () => void) => done() });
  }

  bindMessageHandlers(): void {}
}

interface AppParts {
  controllers?: Type[];
  providers?: Provider[];
}

let app: INestApplication | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/** Like `createTestApp`, with providers too, and an adapter so gateways can be declared. */
async function createApp({ controllers = [], providers = [] }: AppParts): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }), RateLimitModule.forRoot({})],
    controllers,
    providers,
  }).compile();
  app = moduleRef.createNestApplication({ logger: false });
  app.useWebSocketAdapter(new NoSocketWsAdapter());
  await app.init();
  return app;
}

async function bootstrapError(parts: AppParts): Promise<RateLimitConfigurationError> {
  try {
    await createApp(parts);
  } catch (error) {
    expect(error).toBeInstanceOf(RateLimitConfigurationError);
    return error as RateLimitConfigurationError;
  }
  throw new Error('bootstrap succeeded');
}

describe('@RateLimit on a provider other than a controller, resolver or gateway stops app.init()', () => {
  it('on a method of a @WebSocketGateway that is no @SubscribeMessage handler', async () => {
    @WebSocketGateway()
    class ChatGateway {
      @SubscribeMessage('chat')
      @RateLimit(5, '1s')
      onChat() {}

      @RateLimit(5, '1s')
      helper() {}
    }
    const error = await bootstrapError({ providers: [ChatGateway] });
    expect(error.problems).toEqual([
      `@RateLimit on ChatGateway.helper: it is not a handler (no @SubscribeMessage), so nothing reaches it through the guard; put @RateLimit on the handler instead`,
    ]);
  });

  it('on a method of an @Injectable that is no @Resolver', async () => {
    @Injectable()
    class OrdersResolver {
      @RateLimit({ count: 10, window: '1m' })
      orders() {
        return [];
      }
    }
    const error = await bootstrapError({ providers: [OrdersResolver] });
    expect(error.message).toBe(
      `@RateLimit on OrdersResolver.orders: OrdersResolver is a provider, not a controller, resolver or gateway, and ${NOT_SUPPORTED}; remove it, or put it on the handler that leads here`,
    );
  });

  it('on a class made by a factory or given as a value: its instance is what carries the metadata', async () => {
    @RateLimit(1, '1s')
    class MadeByFactory {}
    class GivenAsValue {
      @RateLimit(1, '1s')
      handle() {}
    }
    const error = await bootstrapError({
      providers: [
        { provide: 'made', useFactory: () => new MadeByFactory() },
        { provide: 'given', useValue: new GivenAsValue() },
        // Neither a class nor an instance of one: nothing to read, nothing to fail on.
        { provide: 'plain', useValue: { handle() {} } },
        { provide: 'nothing', useValue: null },
        { provide: 'alias', useExisting: 'made' },
      ],
    });
    expect(error.problems).toHaveLength(2);
    expect(error.message).toContain('@RateLimit on MadeByFactory: MadeByFactory is a provider');
    expect(error.message).toContain('@RateLimit on GivenAsValue.handle: GivenAsValue is a provider');
  });

  it('boots with undecorated providers, and with a controller that is also registered as a provider', async () => {
    @Controller('both')
    @RateLimit(1, '1s')
    class BothController {
      @Get()
      get() {
        return {};
      }
    }
    @Injectable()
    class PlainService {
      work() {}
    }
    await createApp({ controllers: [BothController], providers: [BothController, PlainService] });
    expect(await statuses(app!, '/both', 2)).toEqual([200, 429]);
  });
});

describe('@RateLimit on a microservice handler of a controller stops app.init()', () => {
  it('declared on a @MessagePattern or @EventPattern handler', async () => {
    @Controller()
    class OrdersController {
      @MessagePattern('orders.get')
      @RateLimit(5, '1s')
      getOrder() {}

      @EventPattern('orders.created')
      @RateLimit(5, '1s')
      onCreated(_event: unknown) {}
    }
    const error = await bootstrapError({ controllers: [OrdersController] });
    expect(error.problems).toEqual([
      `@RateLimit on OrdersController.getOrder: OrdersController.getOrder is a microservice handler (@MessagePattern or @EventPattern), and ${NOT_SUPPORTED}; remove it`,
      `@RateLimit on OrdersController.onCreated: OrdersController.onCreated is a microservice handler (@MessagePattern or @EventPattern), and ${NOT_SUPPORTED}; remove it`,
    ]);
  });

  it('declared on a controller that mixes HTTP routes with message handlers: suggests @SkipRateLimit()', async () => {
    @Controller('mixed')
    @RateLimit(5, '1s')
    class MixedController {
      @Get()
      list() {
        return [];
      }

      @MessagePattern('mixed.get')
      getOne() {}
    }
    const error = await bootstrapError({ controllers: [MixedController] });
    expect(error.message).toBe(
      `@RateLimit on MixedController applies to MixedController.getOne, a microservice handler (@MessagePattern or @EventPattern), and ${NOT_SUPPORTED}; put @SkipRateLimit() on MixedController.getOne`,
    );
  });

  it('declared on a controller of message handlers only: suggests removing it', async () => {
    @Controller()
    @RateLimit(5, '1s')
    class EventsController {
      @EventPattern('events.seen')
      onSeen(_event: unknown) {}
    }
    const error = await bootstrapError({ controllers: [EventsController] });
    expect(error.message).toBe(
      `@RateLimit on EventsController applies to EventsController.onSeen, a microservice handler (@MessagePattern or @EventPattern), and ${NOT_SUPPORTED}; remove @RateLimit from EventsController, which has no handler the guard limits`,
    );
  });

  it('boots when @SkipRateLimit() exempts the message handler, and still limits the HTTP route', async () => {
    @Controller('mixed-skip')
    @RateLimit(1, '1s')
    class MixedSkipController {
      @Get()
      list() {
        return [];
      }

      @MessagePattern('mixed.get')
      @SkipRateLimit()
      getOne() {}
    }
    await createApp({ controllers: [MixedSkipController] });
    expect(await statuses(app!, '/mixed-skip', 2)).toEqual([200, 429]);
  });
});

describe('@RateLimit on a controller method that is no route stops app.init()', () => {
  it('names the method and says no request reaches it', async () => {
    @Controller('helper')
    class HelperController {
      @Get()
      get() {
        return this.load();
      }

      @RateLimit(5, '1s')
      load() {
        return {};
      }
    }
    const error = await bootstrapError({ controllers: [HelperController] });
    expect(error.message).toBe(
      '@RateLimit on HelperController.load: it is not a handler (no @Get, @Post or another route decorator), so nothing reaches it through the guard; put @RateLimit on the handler instead',
    );
  });

  it('boots when only a class rule covers the helper: class rules concern route and message handlers only', async () => {
    @Controller('class-helper')
    @RateLimit(1, '1s')
    class ClassHelperController {
      @Get()
      get() {
        return this.load();
      }

      load() {
        return {};
      }
    }
    await createApp({ controllers: [ClassHelperController] });
    expect(await statuses(app!, '/class-helper', 2)).toEqual([200, 429]);
  });
});

it('reports every unsupported handler and every bad value in one error', async () => {
  @WebSocketGateway()
  class ChatGateway {
    @SubscribeMessage('chat')
    @RateLimit({ count: 5, window: '1s', nearLimit: 2 })
    onChat() {}
  }
  @Controller('all')
  class AllController {
    @Get()
    @RateLimit(0, '1s')
    get() {}

    @MessagePattern('all.get')
    @RateLimit(5, '1s')
    getOne() {}

    @RateLimit(5, '1s')
    helper() {}
  }
  const error = await bootstrapError({ controllers: [AllController], providers: [ChatGateway] });
  expect(error.message).toMatch(/^Invalid rate limits:\n/);
  expect(error.problems.map((problem) => problem.slice(0, problem.indexOf(':')))).toEqual(
    expect.arrayContaining([
      '@RateLimit on AllController.get',
      '@RateLimit on AllController.getOne',
      '@RateLimit on AllController.helper',
      '@RateLimit on ChatGateway.onChat',
    ]),
  );
  expect(error.problems).toHaveLength(4);
});

describe('RateLimitGuard, asked directly with contexts no app of ours built', () => {
  /** Never part of an app, so bootstrap never saw it: as a handler registered after init would be. */
  class UnseenHandlers {
    @RateLimit(5, '1s')
    limited() {}

    unlimited() {}
  }

  it.each(['rpc'] as const)('refuses a %s context that has rules, naming the handler', async (type) => {
    await createApp({});
    const guard = app!.get(RateLimitGuard);
    const context = new ExecutionContextHost([{}, {}], UnseenHandlers, UnseenHandlers.prototype.limited);
    context.setType(type);
    await expect(guard.canActivate(context)).rejects.toThrow(RateLimitConfigurationError);
    await expect(guard.canActivate(context)).rejects.toThrow(
      `@RateLimit on UnseenHandlers.limited: it runs in a '${type}' context, and ${NOT_SUPPORTED}`,
    );
  });

  it("decides an HTTP request whose response is neither Node's nor wraps one (an adapter of its own)", async () => {
    @Controller('shaped')
    class ShapedController {
      @Get()
      @RateLimit(1, '1m')
      get() {}
    }
    await createApp({ controllers: [ShapedController] });
    const guard = app!.get(RateLimitGuard);
    const headers: Record<string, string> = {};
    // What Express's adapter calls to set a header; no `headersSent`, no `raw`.
    const response = { set: (name: string, value: string) => (headers[name] = value) };
    const socket = { destroyed: false, readableEnded: false, remoteAddress: '10.0.0.1' };
    const decide = () =>
      guard.canActivate(
        new ExecutionContextHost(
          [{ ip: '10.0.0.1', socket, headers: {} }, response, () => undefined],
          ShapedController,
          ShapedController.prototype.get,
        ),
      );
    await expect(decide()).resolves.toBe(true);
    expect(headers['RateLimit-Remaining']).toBe('0');
    await expect(decide()).rejects.toBeInstanceOf(RateLimitException);
    expect(headers['Retry-After']).toMatch(/^\d+$/);
  });

  it('passes a non-HTTP context that has no rules', async () => {
    await createApp({});
    const guard = app!.get(RateLimitGuard);
    const context = new ExecutionContextHost([{}, {}], UnseenHandlers, UnseenHandlers.prototype.unlimited);
    context.setType('rpc');
    await expect(guard.canActivate(context)).resolves.toBe(true);
  });
});

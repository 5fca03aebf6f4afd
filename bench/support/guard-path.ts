import { Controller, Get, type INestApplication, type Type } from '@nestjs/common';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { RateLimit, RateLimitGuard, type RateLimitModuleOptions, type RateLimitOptions } from 'nest-rate-limit';
import { createTestApp } from '../../test/support/test-app.js';

/** One handler's rules, and how each decision through the guard is made. */
export interface GuardPath {
  /** A decision for client `key` (10.x.y.z), through `canActivate` as Nest calls it for a request. */
  decide(handler: string, key: number): Promise<unknown>;
  close(): Promise<void>;
}

/**
 * The whole decision of an HTTP request without the HTTP server: the app's guard asked for a
 * handler's rules with an execution context as Nest builds one (a request with its client's address
 * and socket, a response taking headers), so what the guard reads and writes is all paid; a
 * refusal is its `RateLimitException`, caught here. Each handler is a controller method with
 * `@RateLimit(rules)`.
 */
export async function createGuardPath(
  redis: string,
  handlers: Record<string, RateLimitOptions[]>,
  options: RateLimitModuleOptions = {},
): Promise<GuardPath> {
  const controllers = Object.entries(handlers).map(([name, rules]) => controllerOf(name, rules));
  const app: INestApplication = await createTestApp({
    controllers,
    rateLimit: { redis, logging: false, ...options },
  });
  const guard = app.get(RateLimitGuard);
  const byName = new Map(controllers.map((controller) => [controller.name, controller]));
  const response = {
    set(): unknown {
      return response;
    },
  };
  const socket = { destroyed: false, readableEnded: false, remoteAddress: '10.0.0.1', localAddress: '127.0.0.1' };
  return {
    decide(handler, key) {
      const controller = byName.get(handler)!;
      // A request of its own each time: the guard decides a request once.
      const request = { ip: `10.0.${key >> 8}.${key & 255}`, socket, headers: {} };
      const context = new ExecutionContextHost(
        [request, response, () => undefined],
        controller,
        controller.prototype.handle,
      );
      try {
        return Promise.resolve(guard.canActivate(context)).catch(refusal);
      } catch (error) {
        return Promise.reject(error);
      }
    },
    close: () => app.close(),
  };
}

function refusal(error: unknown): false {
  if ((error as { getStatus?: () => number }).getStatus?.() !== 429) throw error;
  return false;
}

function controllerOf(name: string, rules: RateLimitOptions[]): Type {
  @Controller(name)
  class BenchController {
    @Get()
    handle(): string {
      return 'ok';
    }
  }
  const descriptor = Object.getOwnPropertyDescriptor(BenchController.prototype, 'handle')!;
  for (const rule of rules) RateLimit(rule)(BenchController.prototype, 'handle', descriptor);
  Object.defineProperty(BenchController, 'name', { value: name });
  return BenchController;
}

import type { INestApplication, ModuleMetadata, Provider, Type } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import type { NestExpressApplication } from '@nestjs/platform-express';
import { Test } from '@nestjs/testing';
import { RateLimitModule } from 'nest-rate-limit';
import type { LogCapture } from './log-capture.js';
import type { Platform } from './matrix.js';

type RateLimitForRoot = Parameters<typeof RateLimitModule.forRoot>[0];

export interface TestAppOptions {
  controllers: Type[];
  /** The app's own providers (an `APP_GUARD` of its own, say). */
  providers?: Provider[];
  rateLimit?: RateLimitForRoot;
  imports?: ModuleMetadata['imports'];
  logger?: LogCapture | false;
  /** HTTP adapter. Default Express. */
  platform?: Platform;
  /** Trust one proxy hop, so `req.ip` is the client named by `X-Forwarded-For`. */
  trustProxy?: boolean;
}

/** A Nest app with `RateLimitModule.forRoot(options.rateLimit)` and the given controllers. */
export async function createTestApp(options: TestAppOptions): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
      RateLimitModule.forRoot(options.rateLimit ?? {}),
      ...(options.imports ?? []),
    ],
    controllers: options.controllers,
    providers: options.providers ?? [],
  }).compile();
  const logger = options.logger ?? false;
  if (options.platform === 'fastify') {
    const adapter = new FastifyAdapter({ trustProxy: options.trustProxy ?? false });
    const app = moduleRef.createNestApplication<NestFastifyApplication>(adapter, { logger });
    await app.init();
    await app.getHttpAdapter().getInstance().ready();
    return app;
  }
  const app = moduleRef.createNestApplication<NestExpressApplication>({ logger });
  if (options.trustProxy) app.set('trust proxy', 1);
  await app.init();
  return app;
}

let prefixes = 0;
/** A key prefix no other test uses, so tests sharing a Redis never see each other's counters. */
export function uniquePrefix(): string {
  prefixes += 1;
  return `t${process.pid}x${prefixes}`;
}

import type { INestApplication, ModuleMetadata, Type } from '@nestjs/common';
import { ConfigModule } from '@nestjs/config';
import { Test } from '@nestjs/testing';
import { RateLimitModule } from '@app/rate-limit';
import type { LogCapture } from './log-capture.js';

type RateLimitForRoot = Parameters<typeof RateLimitModule.forRoot>[0];

export interface TestAppOptions {
  controllers: Type[];
  rateLimit?: RateLimitForRoot;
  imports?: ModuleMetadata['imports'];
  logger?: LogCapture | false;
}

/** A Nest app on Express with `RateLimitModule.forRoot(options.rateLimit)` and the given controllers. */
export async function createTestApp(options: TestAppOptions): Promise<INestApplication> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      ConfigModule.forRoot({ isGlobal: true, ignoreEnvFile: true }),
      RateLimitModule.forRoot(options.rateLimit ?? {}),
      ...(options.imports ?? []),
    ],
    controllers: options.controllers,
  }).compile();
  const app = moduleRef.createNestApplication({ logger: options.logger ?? false });
  await app.init();
  return app;
}

let prefixes = 0;
/** A key prefix no other test uses, so tests sharing a Redis never see each other's counters. */
export function uniquePrefix(): string {
  prefixes += 1;
  return `t${process.pid}x${prefixes}`;
}

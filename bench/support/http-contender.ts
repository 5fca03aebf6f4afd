/**
 * One contender of `bench/http.ts` as a Nest app of its own, in this process: `GET /ping` answers
 * `pong` behind the limiter named by CONTENDER, keyed by the client's address, LIMIT requests a
 * minute (far above the load when admitting; 5 for an attack, so nearly every request is refused).
 *
 *   bare            no limiter
 *   ours-memory     RateLimitModule.forRoot(), the embedded store
 *   ours-redis      RateLimitModule.forRoot({ redis: REDIS_URL })
 *   ours-redis-no-headers   the same with `headers: false`
 *   ours-redis-settle       the same on a route with `settleCost` (1 reserved, at most 2, 1 settled):
 *                   `RateLimitInterceptor` around the handler and its settlement, a second store call
 *   floor           a guard making one EVALSHA of a bare fixed window (INCR, PEXPIRE on the first)
 *   refuse          a guard that refuses every request with a 429 and asks nobody: the least any
 *                   Nest guard pays to answer 429, the ceiling of every limiter under attack
 *   rlf             a guard around rate-limiter-flexible's RateLimiterRedis
 *   rlf-block       the same with its in-memory block
 *   throttler       @nestjs/throttler with @nest-lab/throttler-storage-redis
 *
 * LIBRARY_ENTRY, a path to another build's `dist/index.js`, loads the library from there instead
 * (`bench/http.ts` with BASELINE=<commit>: 'ours-redis' as that commit built it).
 *
 * The app prints `listening <port>` once it serves. `npm run bench:http` builds it with tsc
 * (bench/tsconfig.build.json) and runs it with node.
 */
import 'reflect-metadata';
import {
  type CanActivate,
  Controller,
  type DynamicModule,
  type ExecutionContext,
  Get,
  HttpException,
  HttpStatus,
  Module,
} from '@nestjs/common';
import { APP_GUARD, NestFactory } from '@nestjs/core';
import { ThrottlerGuard, ThrottlerModule } from '@nestjs/throttler';
import { ThrottlerStorageRedisService } from '@nest-lab/throttler-storage-redis';
import { Redis } from 'ioredis';
import { pathToFileURL } from 'node:url';
import { RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import type * as NestRateLimit from 'nest-rate-limit';

// LIBRARY_ENTRY: another build of the library (bench/http.ts's BASELINE), in place of this checkout's,
// so that two commits are measured on the same app.
const { RateLimit, RateLimitModule } = (await import(
  process.env.LIBRARY_ENTRY ? pathToFileURL(process.env.LIBRARY_ENTRY).href : 'nest-rate-limit'
)) as typeof NestRateLimit;

const CONTENDER = process.env.CONTENDER ?? 'bare';
const LIMIT = Number(process.env.LIMIT ?? 1_000_000_000);
const REDIS_URL = process.env.REDIS_URL ?? '';

@Controller()
class PingController {
  @Get('ping')
  ping(): string {
    return 'pong';
  }
}

@Controller()
class LimitedPingController {
  @Get('ping')
  @RateLimit({ count: LIMIT, window: '1m' })
  ping(): string {
    return 'pong';
  }
}

@Controller()
class SettledPingController {
  @Get('ping')
  @RateLimit({ count: LIMIT, window: '1m', settleCost: { actual: () => 1, max: 2 } })
  ping(): string {
    return 'pong';
  }
}

/** The floor: one EVALSHA of a bare fixed window per request, and a 429 past the limit. */
class FloorGuard implements CanActivate {
  private readonly redis = new Redis(REDIS_URL);
  private readonly sha = this.redis.script(
    'LOAD',
    `local count = redis.call('INCR', KEYS[1])
if count == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return count`,
  ) as Promise<string>;

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const { ip } = context.switchToHttp().getRequest<{ ip: string }>();
    const count = Number(await this.redis.evalsha(await this.sha, 1, `floor:{${ip}}`, 60_000));
    if (count > LIMIT) throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
    return true;
  }
}

/** rate-limiter-flexible as its README wires it into a framework: consume, or 429 with Retry-After. */
class FlexibleGuard implements CanActivate {
  constructor(private readonly limiter: RateLimiterRedis) {}

  async canActivate(context: ExecutionContext): Promise<boolean> {
    const http = context.switchToHttp();
    const request = http.getRequest<{ ip: string }>();
    try {
      await this.limiter.consume(request.ip);
      return true;
    } catch (error) {
      if (!(error instanceof RateLimiterRes)) throw error;
      http
        .getResponse<{ setHeader(name: string, value: string): void }>()
        .setHeader('Retry-After', String(Math.ceil(error.msBeforeNext / 1000)));
      throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
    }
  }
}

function appModule(): DynamicModule {
  switch (CONTENDER) {
    case 'bare':
      return { module: BenchModule, controllers: [PingController] };
    case 'ours-memory':
      return { module: BenchModule, imports: [RateLimitModule.forRoot()], controllers: [LimitedPingController] };
    case 'ours-redis':
    case 'ours-redis-no-headers':
      return {
        module: BenchModule,
        imports: [
          RateLimitModule.forRoot({ redis: REDIS_URL, ...(CONTENDER === 'ours-redis' ? {} : { headers: false }) }),
        ],
        controllers: [LimitedPingController],
      };
    case 'ours-redis-settle':
      return {
        module: BenchModule,
        imports: [RateLimitModule.forRoot({ redis: REDIS_URL })],
        controllers: [SettledPingController],
      };
    case 'refuse':
      return {
        module: BenchModule,
        controllers: [PingController],
        providers: [
          {
            provide: APP_GUARD,
            useValue: {
              canActivate: () => {
                throw new HttpException('Too Many Requests', HttpStatus.TOO_MANY_REQUESTS);
              },
            },
          },
        ],
      };
    case 'floor':
      return {
        module: BenchModule,
        controllers: [PingController],
        providers: [{ provide: APP_GUARD, useValue: new FloorGuard() }],
      };
    case 'rlf':
    case 'rlf-block': {
      const limiter = new RateLimiterRedis({
        storeClient: new Redis(REDIS_URL),
        points: LIMIT,
        duration: 60,
        ...(CONTENDER === 'rlf-block' ? { inMemoryBlockOnConsumed: LIMIT, inMemoryBlockDuration: 60 } : {}),
      });
      return {
        module: BenchModule,
        controllers: [PingController],
        providers: [{ provide: APP_GUARD, useValue: new FlexibleGuard(limiter) }],
      };
    }
    case 'throttler':
      return {
        module: BenchModule,
        imports: [
          ThrottlerModule.forRoot({
            throttlers: [{ ttl: 60_000, limit: LIMIT }],
            storage: new ThrottlerStorageRedisService(REDIS_URL),
          }),
        ],
        controllers: [PingController],
        providers: [{ provide: APP_GUARD, useClass: ThrottlerGuard }],
      };
    default:
      throw new Error(
        `CONTENDER=${CONTENDER}: not one of bare, refuse, floor, ours-memory, ours-redis, ours-redis-no-headers, ours-redis-settle, rlf, rlf-block, throttler`,
      );
  }
}

@Module({})
class BenchModule {}

const app = await NestFactory.create(appModule(), { logger: ['error'] });
await app.listen(0, '127.0.0.1');
const address = app.getHttpServer().address() as { port: number };
// bench/http.ts reads this process's memory after a full collection (it runs node with --expose-gc):
// its RSS from /proc, and the V8 heap it keeps, printed here.
process.on('SIGUSR2', () => {
  (globalThis as { gc?: () => void }).gc?.();
  console.log(`heap ${process.memoryUsage().heapUsed}`);
});
console.log(`listening ${address.port}`);
process.on('SIGTERM', () => void app.close().then(() => process.exit(0)));

import { BadRequestException, Controller, type ExecutionContext, Get } from '@nestjs/common';
import { RateLimit, SkipRateLimit } from 'nest-rate-limit';

/** Counts requests per value of the `x-api-key` header; a request without one is refused with 400. */
function apiKey(context: ExecutionContext): string {
  const key = context.switchToHttp().getRequest<{ headers: Record<string, string | string[] | undefined> }>().headers[
    'x-api-key'
  ];
  if (typeof key !== 'string' || key === '') {
    throw new BadRequestException('The x-api-key header is required');
  }
  return key;
}

@Controller()
export class LimitsController {
  /** 5 per 10 s per client IP. */
  @Get('ip')
  @RateLimit({ count: 5, window: '10s' })
  byIp() {
    return { limited: 'per client IP', limit: '5 per 10 s' };
  }

  /** 3 per 10 s per API key. */
  @Get('key')
  @RateLimit({ count: 3, window: '10s', by: apiKey })
  byApiKey() {
    return { limited: 'per x-api-key', limit: '3 per 10 s' };
  }

  /** One counter for the route; threshold from RATE_LIMIT_DEMO_CONFIG_COUNT / _WINDOW when set. */
  @Get('config')
  @RateLimit({ count: 10, window: '60s', configKey: 'demo.config', by: 'global' })
  fromConfig() {
    return { limited: 'one counter for the route', configKey: 'demo.config' };
  }

  /** Per client IP; a huge default for overhead measurements, overridable as RATE_LIMIT_DEMO_PING_*. */
  @Get('ping')
  @RateLimit({ count: 100, window: '1s', configKey: 'demo.ping' })
  @SkipRateLimit('default') // its own limit only: benchmarks measure one rule
  ping() {
    return { pong: true };
  }
}

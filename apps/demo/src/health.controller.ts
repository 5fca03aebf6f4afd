import { Controller, Get } from '@nestjs/common';
import { SkipRateLimit } from 'nest-rate-limit';

@Controller('health')
export class HealthController {
  @Get()
  @SkipRateLimit()
  check() {
    return { status: 'ok' };
  }
}

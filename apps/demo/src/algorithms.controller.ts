import { Controller, Get } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

/** One endpoint per algorithm, each 5 per 10 s per client IP, so their behaviour can be compared. */
@Controller('algorithms')
export class AlgorithmsController {
  /** At most 5 in a window that starts at the first request. */
  @Get('fixed-window')
  @RateLimit({ count: 5, window: '10s', algorithm: 'fixed-window' })
  fixedWindow() {
    return { algorithm: 'fixed-window' };
  }

  /** The last 10 s estimated from this window's count and the previous one's, weighted. */
  @Get('sliding-window')
  @RateLimit({ count: 5, window: '10s', algorithm: 'sliding-window' })
  slidingWindow() {
    return { algorithm: 'sliding-window' };
  }

  /** Exactly 5 in any 10 s. */
  @Get('sliding-log')
  @RateLimit({ count: 5, window: '10s', algorithm: 'sliding-log' })
  slidingLog() {
    return { algorithm: 'sliding-log' };
  }

  /** A burst of 5, then one more every 2 s. */
  @Get('token-bucket')
  @RateLimit({ count: 5, window: '10s', algorithm: 'token-bucket' })
  tokenBucket() {
    return { algorithm: 'token-bucket' };
  }

  /** A burst of 2, then requests spaced 2 s apart. */
  @Get('gcra')
  @RateLimit({ count: 5, window: '10s', algorithm: 'gcra', burst: 2 })
  gcra() {
    return { algorithm: 'gcra' };
  }
}

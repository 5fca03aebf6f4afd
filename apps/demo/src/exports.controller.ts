import { Controller, Get, Query } from '@nestjs/common';
import { setTimeout as delay } from 'node:timers/promises';
import { RateLimit, SkipRateLimit } from 'nest-rate-limit';

/** The longest export the demo runs, in ms. */
const LONGEST_MS = 120_000;

/**
 * A heavy export, which a rate cannot protect: ten slow ones at once hurt the database however
 * rarely they come. So at most 10 run at once across every instance of the app (a cap, `concurrency`),
 * and besides, each client may start 600 a minute (a rate). Both are decided in one store call; a
 * request the cap refuses costs the rate nothing. The cap's slots come back when requests end, and a
 * crashed instance's within 30 s. Its value is live under 'demo.exports' (`count`: the slots).
 */
@Controller('exports')
export class ExportsController {
  /**
   * Runs for `ms` (default 200). Says when it started and ended on the machine's monotonic clock, in
   * ms, so a load test over several instances can check how many ran at once.
   */
  @Get()
  @SkipRateLimit('default')
  @RateLimit({ concurrency: 10, by: 'global', configKey: 'demo.exports' })
  @RateLimit({ count: 600, window: '1m' })
  async export(@Query('ms') ms?: string) {
    const startedAt = monotonicMs();
    await delay(Math.min(Math.max(Number(ms ?? 200) || 0, 0), LONGEST_MS));
    return { rows: 1_000, startedAt, endedAt: monotonicMs() };
  }
}

/** Every process on the machine reads the same monotonic clock. */
function monotonicMs(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

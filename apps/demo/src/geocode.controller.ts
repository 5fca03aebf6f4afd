import { Controller, Get, Query } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

/**
 * A geocoding partner allows this app 5 calls a second in all. A client over it would rather wait a
 * moment than see a 429 it must retry: so a request over the rate waits for room (`wait`), in
 * arrival order, up to 3 s, and 50 at most per instance. One whose turn would come later than that
 * is refused at once, not after 3 s. The time a request waited is its `Server-Timing`
 * (`rate-limit-wait;dur=<ms>`).
 */
@Controller('geocode')
export class GeocodeController {
  @Get()
  @RateLimit({ count: 5, window: '1s', by: 'global', wait: { maxMs: '3s', maxQueued: 50 } })
  geocode(@Query('q') place = 'Lisbon') {
    return { place, lat: 38.72, lon: -9.14 };
  }
}

import { Controller, Get, Param } from '@nestjs/common';
import { RateLimit } from 'nest-rate-limit';

/**
 * A class rule: one budget named `orders` of 10 per 10 s per client IP for every handler here.
 * `GET /orders/:id` replaces it with its own threshold (same name, so the same counter).
 */
@Controller('orders')
@RateLimit({ name: 'orders', count: 10, window: '10s' })
export class OrdersController {
  @Get()
  list() {
    return [{ id: '1' }, { id: '2' }];
  }

  @Get(':id')
  @RateLimit({ name: 'orders', count: 4, window: '10s' })
  find(@Param('id') id: string) {
    return { id };
  }
}

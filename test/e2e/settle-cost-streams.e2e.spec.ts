import { Controller, Get, type INestApplication, type MessageEvent, Query, Req, Res, Sse } from '@nestjs/common';
import { get } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import type { ServerResponse } from 'node:http';
import { NEVER, Observable, concat, finalize, from, map, tap } from 'rxjs';
import { RateLimit, type RateLimitRequestDecision, RateLimiterService } from 'nest-rate-limit';
import { afterEach, expect, it } from 'vitest';
import { type Platform, describePlatforms, sharedRedis } from '../support/matrix.js';
import { until, usedOnceSettled } from '../support/poll.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

type Limited = { rateLimit: RateLimitRequestDecision; query: Record<string, string | undefined> };

/** The tenants whose `@Sse()` stream has been unsubscribed (ended, failed, or left by its client). */
const streamsEnded = new Set<string>();

/** Tokens per chunk of the "model's" answer. */
const TOKENS_PER_CHUNK = 10;

/** 20 tokens reserved, 100 at most; a stream whose handler reports nothing is settled at its most. */
const BUDGET = {
  count: 1_000,
  window: '1m',
  by: (context: { switchToHttp(): { getRequest<T>(): T } }) =>
    context.switchToHttp().getRequest<Limited>().query.tenant!,
  cost: 20,
  settleCost: { actual: () => 100, max: 100 },
} as const;

@Controller()
class StreamsController {
  /** `chunks` chunks, each reported as it goes; then the stream ends, or (`open`) stays open. */
  @Sse('answer')
  @RateLimit(BUDGET)
  answer(@Req() req: Limited, @Query('chunks') chunks: string, @Query('open') open?: string): Observable<MessageEvent> {
    let tokens = 0;
    const sent = from(Array.from({ length: Number(chunks) }, (_, i) => `chunk ${i}`)).pipe(
      tap(() => req.rateLimit.report((tokens += TOKENS_PER_CHUNK))),
      map((data) => ({ data })),
    );
    return (open ? concat(sent, NEVER) : sent).pipe(finalize(() => streamsEnded.add(req.query.tenant!)));
  }

  /** An answer piped to the response; the handler returns before it is written, and reports its cost. */
  @Get('piped')
  @RateLimit(BUDGET)
  piped(@Req() req: Limited, @Res() response: ServerResponse | { raw: ServerResponse }): void {
    const raw = 'raw' in response ? response.raw : response;
    raw.writeHead(200, { 'content-type': 'text/plain' });
    const chunks = ['lorem ', 'ipsum ', 'dolor'];
    const answer = new Readable({
      read() {
        // One chunk a turn: the handler has long returned when the answer ends.
        setImmediate(() => {
          const chunk = chunks.shift();
          if (chunk) req.rateLimit.report((3 - chunks.length) * 15);
          this.push(chunk ?? null);
        });
      },
    });
    answer.pipe(raw);
  }
}

/** A real SSE client: a GET asking for text/event-stream; the events read, then `leaveAfter` it hangs up. */
function readEvents(
  app: INestApplication,
  path: string,
  leaveAfter?: number,
): Promise<{ events: string[]; type: string }> {
  const { port } = (app.getHttpServer() as { address(): AddressInfo }).address();
  return new Promise((resolve, reject) => {
    const request = get({ host: '127.0.0.1', port, path, headers: { accept: 'text/event-stream' } }, (response) => {
      const type = String(response.headers['content-type']);
      const events: string[] = [];
      let buffered = '';
      response.setEncoding('utf8');
      response.on('data', (text: string) => {
        buffered += text;
        const blocks = buffered.split('\n\n');
        buffered = blocks.pop()!;
        for (const block of blocks) {
          const data = block.split('\n').find((line) => line.startsWith('data: '));
          if (data) events.push(data.slice(6));
        }
        if (leaveAfter !== undefined && events.length >= leaveAfter) {
          request.destroy();
          resolve({ events, type });
        }
      });
      response.on('end', () => resolve({ events, type }));
      response.on('error', () => undefined);
    });
    request.on('error', (error) => (leaveAfter === undefined ? reject(error) : undefined));
  });
}

/** Starts the app on a loopback port; settled units of a route for a tenant, once settled. */
function streamsApp(platform: Platform) {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });
  return {
    start: async (): Promise<INestApplication> => {
      const redis = await sharedRedis();
      app = await createTestApp({
        platform,
        controllers: [StreamsController],
        rateLimit: { redis: redis.url, keyPrefix: uniquePrefix() },
      });
      await app.listen(0, '127.0.0.1');
      return app;
    },
    settledAt: (route: string, tenant: string, units: number) =>
      usedOnceSettled(app!.get(RateLimiterService), `StreamsController.${route}`, tenant, units),
  };
}

describePlatforms('settleCost on an @Sse() stream: settled when the stream ends, at the cost reported', (platform) => {
  const { start, settledAt } = streamsApp(platform);

  it('an @Sse() stream that completes: the tokens its handler reported, not its last event', async () => {
    const app = await start();
    const { events, type } = await readEvents(app, '/answer?tenant=acme&chunks=7');
    expect(type).toContain('text/event-stream');
    expect(events).toHaveLength(7);
    expect(await settledAt('answer', 'acme', 70)).toBe(70);
  });

  it('an @Sse() stream its client leaves: unsubscribed, and settled at the tokens reported so far', async () => {
    const app = await start();
    streamsEnded.clear();
    // 3 chunks, then the stream stays open: only the client leaving ends it.
    const { events } = await readEvents(app, '/answer?tenant=initech&chunks=3&open=1', 3);
    expect(events).toEqual(['chunk 0', 'chunk 1', 'chunk 2']);
    await until(() => streamsEnded.has('initech'), { timeoutMs: 5_000, what: 'the handler stream unsubscribed' });
    // Not the reservation (20), nor the most a stream that reports nothing is settled at (100).
    expect(await settledAt('answer', 'initech', 30)).toBe(30);
  });
});

describePlatforms('settleCost on an answer piped with @Res()', (platform) => {
  const { start, settledAt } = streamsApp(platform);

  it('an answer piped with @Res(): settled once the response ends, at the cost reported', async () => {
    const app = await start();
    const { port } = (app.getHttpServer() as { address(): AddressInfo }).address();
    const text = await new Promise<string>((resolve, reject) => {
      get({ host: '127.0.0.1', port, path: '/piped?tenant=globex' }, (response) => {
        let body = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (body += chunk));
        response.on('end', () => resolve(body));
      }).on('error', reject);
    });
    expect(text).toBe('lorem ipsum dolor');
    expect(await settledAt('piped', 'globex', 45)).toBe(45);
  });
});

import { Controller, Get, type INestApplication, Query } from '@nestjs/common';
import { Redis } from 'ioredis';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';

/** Which instance ran each admitted request, in the order they ran. */
const ran: string[] = [];

@Controller('shared')
class SharedController {
  @Get()
  @RateLimit({ count: 10, window: '1s', by: 'global', wait: { maxMs: '12s' } })
  run() {
    return {};
  }
}

/** The one slot's holder runs until the test opens the gate; each handler says when it started. */
const slot = {
  gate: Promise.resolve(),
  open: () => undefined as void,
  started: new Map<string, number>(),
  onStart: (_from: string) => undefined as void,
};

@Controller('capped')
class CappedController {
  @Get()
  @RateLimit({ concurrency: 1, by: 'global', wait: { maxMs: '5s' } })
  async run(@Query('from') from: string) {
    slot.started.set(from, performance.now());
    slot.onStart(from);
    await slot.gate;
    return {};
  }
}

describe('waiting across two instances of one Redis', () => {
  let server: RedisServer;
  const apps: { app: INestApplication; url: string; base: string }[] = [];
  let prefix: string;

  beforeAll(async () => {
    server = await startRedisServer();
    prefix = uniquePrefix();
    for (const name of ['a', 'b']) {
      const app = await createTestApp({
        controllers: [SharedController, CappedController],
        rateLimit: { redis: server.url, keyPrefix: prefix },
      });
      await app.listen(0, '127.0.0.1');
      const { port } = app.getHttpServer().address() as AddressInfo;
      apps.push({ app, url: `http://127.0.0.1:${port}/shared?from=${name}`, base: `http://127.0.0.1:${port}` });
    }
  });

  afterAll(async () => {
    await Promise.all(apps.map(({ app }) => app.close()));
    await server?.stop();
  });

  it('admits both instances’ waiters within the limit, neither starving the other', async () => {
    const sent = apps.flatMap(({ url }, i) =>
      Array.from({ length: 40 }, async () => {
        const response = await fetch(url);
        await response.arrayBuffer();
        if (response.status === 200) ran.push(i === 0 ? 'a' : 'b');
        return response.status;
      }),
    );
    expect(await Promise.all(sent)).toEqual(Array(80).fill(200));
    // In the first half of the admissions, each instance had a fair part.
    const firstHalf = ran.slice(0, 40);
    expect(firstHalf.filter((from) => from === 'a').length).toBeGreaterThanOrEqual(10);
    expect(firstHalf.filter((from) => from === 'b').length).toBeGreaterThanOrEqual(10);
  }, 30_000);

  it('a slot given back on one instance wakes a request waiting for it on another at once, not at its next retry', async () => {
    // Every command Redis receives under this test's keys, as it receives it.
    const watcher = new Redis(server.url);
    const monitor = await watcher.monitor();
    let onCommand = () => undefined as void;
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (args.some((arg) => arg.startsWith(prefix))) onCommand();
    });
    const event = (arm: (done: () => void) => void) => new Promise<void>((resolve) => arm(resolve));
    try {
      for (let trial = 0; trial < 3; trial += 1) {
        slot.gate = new Promise((resolve) => (slot.open = resolve));
        // a's request takes the slot and holds it.
        const aStarted = event((done) => (slot.onStart = (from) => from === `a${trial}` && done()));
        const a = fetch(`${apps[0].base}/capped?from=a${trial}`);
        await aStarted;
        // b's asks, is refused, and waits: a cap's refusal says to retry in a second.
        const bAsked = event((done) => (onCommand = done));
        const b = fetch(`${apps[1].base}/capped?from=b${trial}`);
        await bAsked;
        onCommand = () => undefined;
        const opened = performance.now();
        slot.open();
        expect([(await a).status, (await b).status]).toEqual([200, 200]);
        // Woken by a's release as the store's news told b's instance, well before that second.
        expect(slot.started.get(`b${trial}`)! - opened).toBeLessThan(500);
      }
    } finally {
      watcher.disconnect();
    }
  }, 30_000);
});

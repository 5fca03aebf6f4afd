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

async function holdSlot(from: string) {
  slot.started.set(from, performance.now());
  slot.onStart(from);
  await slot.gate;
  return {};
}

@Controller('capped')
class CappedController {
  @Get()
  @RateLimit({ concurrency: 1, by: 'global', wait: { maxMs: '5s' } })
  run(@Query('from') from: string) {
    return holdSlot(from);
  }
}

/** Which instance ran each request of the shared cap, in the order they started. */
const turns: string[] = [];

@Controller('turns')
class TurnsController {
  /** One at a time across instances, each a few ms long; the others wait. */
  @Get()
  @RateLimit({ concurrency: 1, by: 'global', wait: { maxMs: '10s' } })
  async run(@Query('from') from: string) {
    turns.push(from);
    await new Promise((resolve) => setTimeout(resolve, 20));
    return {};
  }
}

/** A rate and a cap on one handler, both waiting, in either order. */
@Controller('paired')
class PairedController {
  @Get('rate-first')
  @RateLimit({ name: 'paired-rate-a', count: 100, window: '1m', by: 'global', wait: { maxMs: '5s' } })
  @RateLimit({ name: 'paired-cap-a', concurrency: 1, by: 'global', wait: { maxMs: '5s' } })
  rateFirst(@Query('from') from: string) {
    return holdSlot(from);
  }

  @Get('cap-first')
  @RateLimit({ name: 'paired-cap-b', concurrency: 1, by: 'global', wait: { maxMs: '5s' } })
  @RateLimit({ name: 'paired-rate-b', count: 100, window: '1m', by: 'global', wait: { maxMs: '5s' } })
  capFirst(@Query('from') from: string) {
    return holdSlot(from);
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
        controllers: [SharedController, CappedController, PairedController, TurnsController],
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

  /** Every command Redis receives under this test's keys calls `onCommand`, as Redis receives it. */
  async function watchCommands(): Promise<{ next: () => Promise<void>; stop: () => void }> {
    const watcher = new Redis(server.url);
    const monitor = await watcher.monitor();
    let onCommand = () => undefined as void;
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (args.some((arg) => arg.startsWith(prefix))) onCommand();
    });
    return {
      next: () =>
        new Promise<void>((resolve) => {
          onCommand = () => {
            onCommand = () => undefined;
            resolve();
          };
        }),
      stop: () => watcher.disconnect(),
    };
  }

  /**
   * A request to `holderUrl` takes the one slot and holds it; one to `waiterUrl` asks, is refused
   * (a cap's refusal says to retry in a second) and waits; the slot is given back. How long after
   * that the waiter's handler started, in ms.
   */
  async function wokenAfter(holderUrl: string, waiterUrl: string, trial: string): Promise<number> {
    const commands = await watchCommands();
    try {
      slot.gate = new Promise((resolve) => (slot.open = resolve));
      const holderIn = new Promise<void>((resolve) => (slot.onStart = (from) => from === `h${trial}` && resolve()));
      const holder = fetch(`${holderUrl}?from=h${trial}`);
      await holderIn;
      const asked = commands.next();
      const waiter = fetch(`${waiterUrl}?from=w${trial}`);
      await asked;
      const opened = performance.now();
      slot.open();
      expect([(await holder).status, (await waiter).status]).toEqual([200, 200]);
      return slot.started.get(`w${trial}`)! - opened;
    } finally {
      commands.stop();
    }
  }

  it('a slot given back on one instance wakes a request waiting for it on another at once, not at its next retry', async () => {
    for (let trial = 0; trial < 3; trial += 1) {
      // Woken by the holder's release as the store's news told the waiter's instance.
      expect(await wokenAfter(`${apps[0].base}/capped`, `${apps[1].base}/capped`, `x${trial}`)).toBeLessThan(500);
    }
  }, 30_000);

  it.each(['rate-first', 'cap-first'])(
    'a rate and a cap waiting on one handler (%s): the slot given back wakes the waiter at once, whichever keys its queue',
    async (route) => {
      const url = `${apps[0].base}/paired/${route}`;
      for (let trial = 0; trial < 3; trial += 1) {
        expect(await wokenAfter(url, url, `${route}${trial}`)).toBeLessThan(500);
      }
    },
    30_000,
  );

  it('a cap: the instance that gives a slot back has no head start on the other’s waiters', async () => {
    turns.length = 0;
    const sent = apps.flatMap(({ base }, i) =>
      Array.from({ length: 12 }, () => fetch(`${base}/turns?from=${i === 0 ? 'a' : 'b'}`).then((r) => r.status)),
    );
    expect(await Promise.all(sent)).toEqual(Array(24).fill(200));
    // In the first half of the turns, each instance had a fair part.
    const firstHalf = turns.slice(0, 12);
    expect(firstHalf.filter((from) => from === 'a').length).toBeGreaterThanOrEqual(3);
    expect(firstHalf.filter((from) => from === 'b').length).toBeGreaterThanOrEqual(3);
  }, 30_000);
});

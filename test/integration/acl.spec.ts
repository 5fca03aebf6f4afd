import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Controller, type ExecutionContext, Get, type INestApplication } from '@nestjs/common';
import request from 'supertest';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit } from 'nest-rate-limit';
import {
  RateLimitManagementService,
  RateLimitPermissionError,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import { RateLimitHealthIndicator, rateLimitHealth } from 'nest-rate-limit/ops';
import { type RateLimitHit, RateLimitStore } from 'nest-rate-limit/store';
import { ROOT } from '../support/demo-process.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createTestApp } from '../support/test-app.js';

/*
 * The app under the least-privilege Redis user the docs give, read from docs/operations.md: every
 * feature works and nothing is logged; less one command or the channel, the app stops at its start
 * naming it; less what is optional, it serves and says what it does without.
 */

/** The `ACL SETUSER` line docs/operations.md gives after `<!-- acl:<name> -->`. */
function documentedAcl(name: string): string {
  const page = readFileSync(new URL('../../docs/operations.md', import.meta.url), 'utf8');
  const line = new RegExp(`<!-- acl:${name} -->\\s*\`\`\`text\\n(ACL SETUSER [^\\n]+)\\n\`\`\``).exec(page)?.[1];
  if (!line) throw new Error(`docs/operations.md has no ACL line after <!-- acl:${name} -->`);
  return line;
}

const documented = documentedAcl('app');

/** A cap's hit as the limiter makes it: a sliding log of its lease, one slot. */
const capHit: RateLimitHit = {
  key: '',
  algorithm: 'sliding-log',
  limit: 1,
  windowMs: 30_000,
  cost: 1,
  burst: 1,
  blockMs: 0,
  conditional: false,
  slot: true,
};
const CLI = join(ROOT, 'libs/rate-limit/dist/bin/limits.js');

const byUser = (context: ExecutionContext) =>
  context.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

@Controller()
class AclController {
  @Get('acl')
  @RateLimit({ name: 'acl', count: 3, window: '10m', by: byUser, configKey: 'acl.route' })
  limited() {
    return {};
  }

  @Get('acl/cap')
  @RateLimit({ concurrency: 1, by: byUser })
  capped() {
    return {};
  }
}

describe('under the documented least-privilege ACL', () => {
  let server: RedisServer;
  let app: INestApplication | undefined;
  let logs: LogCapture;

  beforeAll(async () => {
    server = await startRedisServer();
  });

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  afterAll(() => server?.stop());

  /** Creates `user` by the documented line, changed by `edit`; the app's Redis URL as that user. */
  async function userBy(
    user: string,
    edit: (line: string) => string = (line) => line,
    acl = documented,
  ): Promise<string> {
    const line = edit(acl.replace(/^ACL SETUSER \S+/, `ACL SETUSER ${user}`).replace('>CHANGE-ME', '>secret'));
    expect(await server.client().call(...(line.split(' ') as [string, ...string[]]))).toBe('OK');
    return `redis://${user}:secret@127.0.0.1:${server.port}`;
  }

  async function start(url: string): Promise<INestApplication> {
    logs = new LogCapture();
    app = await createTestApp({
      controllers: [AclController],
      rateLimit: {
        redis: url,
        keyPrefix: 'rl',
        configCentre: RedisConfigCentre,
        extensions: [rateLimitManagement(), rateLimitHealth()],
      },
      logger: logs,
    });
    return app;
  }

  const get = (user: string) => request(app!.getHttpServer()).get('/acl').set('x-user', user);

  it('runs every feature, and logs no refusal', async () => {
    await start(await userBy('rate-limit'));
    const statuses = [];
    for (let i = 0; i < 5; i += 1) statuses.push((await get('alice')).status);
    expect(statuses).toEqual([200, 200, 200, 429, 429]);

    const admin = app!.get(RateLimitManagementService);
    expect(await admin.inspect('acl', 'alice')).toMatchObject({ used: 3, limit: 3 });
    await admin.reset('acl', 'alice');
    await get('alice').expect(200);
    await admin.set('acl.route', { count: 10 });
    expect(await admin.get('acl.route')).toMatchObject({ configKey: 'acl.route' });
    expect((await admin.list()).map((entry) => entry.configKey)).toContain('acl.route');
    expect(await admin.delete('acl.route')).toBe(true);

    // A cap: each slot taken and given back, and one renewed, by the scripts under the same ACL.
    for (let i = 0; i < 3; i += 1) await request(app!.getHttpServer()).get('/acl/cap').set('x-user', 'bob').expect(200);
    const store = app!.get(RateLimitStore);
    const slot = { ...capHit, key: 'rl:{acl-cap}:c:sl' };
    const taken = await store.consume([slot]);
    expect(await store.renewSlots([{ hit: slot, receipt: taken.receipts![0] }])).toEqual([expect.any(Number)]);
    await store.settle([{ hit: slot, receipt: taken.receipts![0], refund: true }]);
    expect((await store.consume([slot])).allowed).toBe(true);

    const { rate_limit: health } = await app!.get(RateLimitHealthIndicator).isHealthy();
    expect(health).toMatchObject({ status: 'up', redis: 'up', scriptsLoaded: true, liveConfigInSync: true });
    expect(health.memory?.policy).toBe('noeviction');
    // Nothing refused anywhere: no warning or error but the (sampled) rejection line.
    expect([...logs.at('warn'), ...logs.at('error')].filter((line) => !line.startsWith('Rejected by rule'))).toEqual(
      [],
    );
  });

  it('less one command the scripts run, the app stops at its start, naming it', async () => {
    const url = await userBy('no-incrby', (line) => line.replace(' +incrby', ''));
    await expect(start(url)).rejects.toThrow(
      /^RateLimitModule: Redis \(.*\) refuses what the rate limiter runs: incrby \(ERR The user executing the script can't run this command/,
    );
  });

  it('less the channel, the app stops at its start, naming it', async () => {
    const url = await userBy('no-channel', (line) => line.replace(' &rl:lifted', ''));
    await expect(start(url)).rejects.toThrow(/refuses what the rate limiter runs: publish \(ERR The user executing/);
  });

  it('less SUBSCRIBE, it serves without the block cache and the news of live limits, saying so once each', async () => {
    await start(await userBy('no-subscribe', (line) => line.replace(' +subscribe', '')));
    const statuses = [];
    for (let i = 0; i < 5; i += 1) statuses.push((await get('bob')).status);
    expect(statuses).toEqual([200, 200, 200, 429, 429]);
    const warnings = logs.at('warn').filter((line) => !line.startsWith('Rejected by rule'));
    expect(warnings.toSorted()).toEqual([
      expect.stringMatching(
        /^Subscribing to rl:config:changed failed \(.*NOPERM.*\); limits written to Redis reach this instance every 5000 ms only/,
      ),
      expect.stringMatching(/^Subscribing to rl:lifted failed \(.*NOPERM.*\); the block cache stays off/),
    ]);
  });

  it('less PUBSUB NUMSUB, the instances are not counted, and it says so once', async () => {
    await start(await userBy('no-numsub', (line) => line.replace(' +pubsub|numsub', '')));
    await get('carol').expect(200);
    await until(() => logs.at('warn', /^Counting the instances/).length > 0, { timeoutMs: 5_000, what: 'the warning' });
    expect(
      logs.at('warn', /^Counting the instances \(PUBSUB NUMSUB rl:lifted\) failed .*NOPERM.*expectedInstances$/),
    ).toHaveLength(1);
  });

  it('management writes carry who made them; a read-only user gets, lists and inspects, and changes nothing', async () => {
    await start(await userBy('rate-limit'));
    for (let i = 0; i < 2; i += 1) await get('dave').expect(200);
    const admin = app!.get(RateLimitManagementService);
    await admin.set('acl.route', { count: 5 }, { by: 'alice' });
    await admin.reset('acl', 'erin', { by: 'bob' });
    expect(await admin.changeLog(2)).toMatchObject([
      { by: 'bob', change: 'reset', rules: ['acl'], identity: 'erin', at: expect.any(String) },
      { by: 'alice', change: 'set', configKey: 'acl.route', values: { count: 5 } },
    ]);

    // The CLI, as a read-only user: reads work, writes are refused naming what Redis refused.
    const viewer = await userBy('viewer', (line) => line, documentedAcl('viewer'));
    const cli = (...args: string[]) =>
      promisify(execFile)(process.execPath, [CLI, ...args], {
        env: { ...process.env, REDIS_URL: viewer, RATE_LIMIT_PREFIX: 'rl' },
      }).then(
        ({ stdout }) => ({ code: 0, stdout, stderr: '' }),
        (error: { code: number; stdout: string; stderr: string }) => error,
      );
    const listed = await cli('list');
    expect(listed.code).toBe(0);
    expect(JSON.parse(listed.stdout)).toContainEqual(
      expect.objectContaining({ configKey: 'acl.route', written: { count: 5 } }),
    );
    expect(JSON.parse((await cli('get', 'acl.route')).stdout)).toMatchObject({ written: { count: 5 } });
    expect(JSON.parse((await cli('inspect', 'acl', 'dave')).stdout)).toMatchObject({ rule: 'acl', used: 2 });
    expect(JSON.parse((await cli('changes', '1')).stdout)).toMatchObject([{ by: 'bob' }]);
    for (const write of [
      ['set', 'acl.route', 'count=50'],
      ['delete', 'acl.route'],
      ['reset', 'acl', 'dave'],
    ]) {
      const refused = await cli(...write);
      expect(refused.code, write.join(' ')).toBe(3);
      expect(refused.stderr).toMatch(
        /Redis refused it for lack of permission \(NOPERM .*'multi' command\); nothing was changed/,
      );
    }
    // Nothing changed: the limit, the count, the log.
    expect(await admin.get('acl.route')).toMatchObject({ written: { count: 5 } });
    expect(await admin.inspect('acl', 'dave')).toMatchObject({ used: 2 });
    expect(await admin.changeLog(1)).toMatchObject([{ by: 'bob', change: 'reset' }]);
    // The management service, as the read-only user: a RateLimitPermissionError.
    const viewerApp = await createTestApp({
      controllers: [],
      rateLimit: {
        redis: viewer,
        keyPrefix: 'rl',
        configCentre: RedisConfigCentre,
        extensions: [rateLimitManagement()],
      },
    });
    try {
      const refused = viewerApp.get(RateLimitManagementService).set('acl.route', { count: 50 }, { by: 'mallory' });
      await expect(refused).rejects.toThrow(RateLimitPermissionError);
      await expect(refused).rejects.toThrow(/^RateLimitManagementService.set: Redis refused it for lack of permission/);
    } finally {
      await viewerApp.close();
    }
  }, 30_000);
});

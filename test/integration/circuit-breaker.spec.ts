import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import type { RateLimitStore, RateLimitStoreErrorOptions } from 'nest-rate-limit/store';
import { fixedWindowCount } from '../support/inspect.js';
import { LogCapture } from '../support/log-capture.js';
import { until } from '../support/poll.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';
import { createStore, hit } from '../support/store-module.js';
import { uniquePrefix } from '../support/test-app.js';

/** A script that keeps Redis busy for ARGV[1] µs, as a slow command does. */
const SPIN = `local t0 = redis.call('TIME')
local start = t0[1] * 1000000 + t0[2]
repeat local t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= tonumber(ARGV[1])
return 1`;

function scriptCalls(info: string): number {
  return [...info.matchAll(/^cmdstat_(evalsha|eval):calls=(\d+)/gm)].reduce((sum, m) => sum + Number(m[2]), 0);
}

describe('the circuit breaker in front of Redis', () => {
  let server: RedisServer;
  let redis: Redis;
  const logs = new LogCapture();

  beforeAll(async () => {
    server = await startRedisServer();
    redis = server.client();
    Logger.overrideLogger(logs);
  });

  afterEach(() => {
    process.kill(server.pid, 'SIGCONT');
    vi.useRealTimers();
  });

  afterAll(() => server?.stop());

  async function storeWith(
    circuitBreaker: RateLimitStoreErrorOptions['circuitBreaker'],
    storeErrors: RateLimitStoreErrorOptions = {},
  ) {
    const created = await createStore({
      redis: server.url,
      storeErrors: { timeoutMs: 50, circuitBreaker, ...storeErrors },
    });
    Logger.overrideLogger(logs);
    return created;
  }

  async function failWhilePaused(store: RateLimitStore, key: string): Promise<string> {
    return store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]).then(
      () => 'admitted',
      (error: Error) => error.constructor.name,
    );
  }

  it('opens after N consecutive calls unanswered past their deadline, sends nothing while open, then half-opens and closes', async () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const {
      store,
      redis: service,
      close,
    } = await storeWith({
      consecutiveFailures: 3,
      halfOpenAfterMs: 5_000,
    });
    const key = `${uniquePrefix()}:{b}:r:fw`;
    try {
      await store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]);
      process.kill(server.pid, 'SIGSTOP');
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      expect(service.runner.circuitState).toBe('closed');
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      // A call past its deadline counts once it has gone unanswered a second more: a slow Redis is
      // not a failing one (see the next test but one).
      expect(service.runner.circuitState).toBe('closed');
      await until(() => service.runner.circuitState === 'open', { timeoutMs: 5_000, what: 'the circuit opening' });

      process.kill(server.pid, 'SIGCONT');
      // The three timed-out calls were sent; let them land before counting what arrives.
      await until(async () => (await fixedWindowCount(redis, key)) === 4, {
        timeoutMs: 5_000,
        intervalMs: 20,
        what: `a count of 4 at ${key}`,
      });
      await redis.config('RESETSTAT');
      for (let i = 0; i < 20; i += 1) expect(await failWhilePaused(store, key)).toBe('BrokenCircuitError');
      expect(scriptCalls(await redis.info('commandstats'))).toBe(0);

      vi.setSystemTime(Date.now() + 5_000);
      await store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]);
      expect(service.runner.circuitState).toBe('closed');
      expect(scriptCalls(await redis.info('commandstats'))).toBe(1);
      expect(logs.lines.filter((line) => /Redis circuit/.test(line.message)).map((line) => line.message)).toEqual([
        expect.stringMatching(/^Redis circuit open/),
        expect.stringMatching(/^Redis circuit half-open/),
        expect.stringMatching(/^Redis circuit closed/),
      ]);
    } finally {
      await close();
    }
  });

  it('stays closed while Redis answers late: a slow Redis is not a failing one', async () => {
    const { store, redis: service, close } = await storeWith({ consecutiveFailures: 3 });
    const key = `${uniquePrefix()}:{s}:r:fw`;
    try {
      for (let i = 0; i < 14; i += 1) await store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]);
      process.kill(server.pid, 'SIGSTOP');
      // 8 calls past their deadline: 8 in a row, 36% of the window, either would open the circuit.
      for (let i = 0; i < 8; i += 1) expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      process.kill(server.pid, 'SIGCONT');
      // They run late, and their answers count as successes.
      await until(async () => (await fixedWindowCount(redis, key)) === 22, {
        timeoutMs: 5_000,
        intervalMs: 20,
        what: `a count of 22 at ${key}`,
      });
      await until(() => service.runner.lateCalls.unanswered + service.runner.lateCalls.answered === 8, {
        timeoutMs: 5_000,
        what: 'the 8 late calls judged',
      });
      expect(service.runner.lateCalls.unanswered).toBe(0);
      expect(service.runner.circuitState).toBe('closed');
      expect(await failWhilePaused(store, key)).toBe('admitted');
    } finally {
      await close();
    }
  });

  it("a cap's slot that a call past its deadline took late is given back: the request was decided without it", async () => {
    const { store, redis: service, close } = await storeWith(false);
    const key = `${uniquePrefix()}:{cap}:exports:sl`;
    const cap = hit(key, { algorithm: 'sliding-log', limit: 1, windowMs: 30_000, slot: true });
    try {
      const stall = (service.client as Redis).eval(SPIN, 0, 300_000);
      const late = await store.consume([cap]).then(
        () => 'admitted',
        (error: Error) => error.constructor.name,
      );
      expect(late).toBe('RedisTimeoutError');
      await stall;
      await until(() => service.runner.lateCalls.answered === 1, { timeoutMs: 5_000, what: 'the late call judged' });
      // Redis ran it once the stall ended, and its settlement follows: no slot left held for 30 s.
      await until(async () => (await redis.zcard(key)) === 0, { timeoutMs: 2_000, what: 'the late slot given back' });
      expect((await store.consume([cap])).allowed).toBe(true);
    } finally {
      await close();
    }
  });

  it('a call past its deadline fails at it, and is judged when its answer comes, or a second on', async () => {
    const { store, redis: service, close } = await storeWith(false);
    const key = `${uniquePrefix()}:{w}:r:fw`;
    try {
      await store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]);
      // Redis busy for 300 ms (a slow command), sent ahead of the call on its own connection: the
      // call misses its 50 ms deadline and fails there; Redis runs it later, and its answer counts.
      const stall = (service.client as Redis).eval(SPIN, 0, 300_000);
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      await stall;
      await until(() => service.runner.lateCalls.answered === 1, { timeoutMs: 5_000, what: 'the late call judged' });
      expect(service.runner.lateCalls).toEqual({ answered: 1, unanswered: 0 });
      expect(service.runner.seemsDown).toBe(false);
      expect(await fixedWindowCount(redis, key)).toBe(2);

      // Paused: calls fail at their deadline too; one unanswered a second on makes Redis seem down.
      process.kill(server.pid, 'SIGSTOP');
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      expect(service.runner.lateCalls).toEqual({ answered: 1, unanswered: 0 });
      await until(() => service.runner.lateCalls.unanswered === 1, {
        timeoutMs: 5_000,
        what: 'the call judged unanswered',
      });
      expect(service.runner.seemsDown).toBe(true);

      // Back: a call answered on time says so.
      process.kill(server.pid, 'SIGCONT');
      await until(async () => (await failWhilePaused(store, key)) === 'admitted', {
        timeoutMs: 5_000,
        what: 'a call answered on time',
      });
      expect(service.runner.seemsDown).toBe(false);
    } finally {
      process.kill(server.pid, 'SIGCONT');
      await close();
    }
  });

  it("hands over a late call's answer, decoded by the script consume chose for it (fast or full)", async () => {
    const { store, close } = await storeWith(false);
    const prefix = uniquePrefix();
    const fast = hit(`${prefix}:{f}:r:fw`, { limit: 10, windowMs: 600_000 });
    // blockFor takes the full script.
    const full = hit(`${prefix}:{g}:r:fw`, { limit: 10, windowMs: 600_000, blockMs: 60_000 });
    try {
      for (const each of [fast, full]) await store.consume([each]);
      process.kill(server.pid, 'SIGSTOP');
      const errors = await Promise.all(
        [fast, full].map((each) => store.consume([each]).catch((error: unknown) => error)),
      );
      expect(errors.map((error) => (error as Error).name)).toEqual(['RedisTimeoutError', 'RedisTimeoutError']);
      const late = [store.lateAnswer([fast], errors[0]), store.lateAnswer([full], errors[1])];
      process.kill(server.pid, 'SIGCONT');
      const answers = await Promise.all(late);
      expect(answers.map((answer) => [answer!.allowed, answer!.decisions[0].remaining])).toEqual([
        [true, 8],
        [true, 8],
      ]);
    } finally {
      await close();
    }
  });

  it('opens when the share of failed calls in the window reaches the ratio, not before', async () => {
    const {
      store,
      redis: service,
      close,
    } = await storeWith({
      // The share alone (CIRCUIT_BREAKER_SHARE: 30% of 20 calls or more in 10 s) opens it.
      consecutiveFailures: 1_000,
    });
    const key = `${uniquePrefix()}:{r}:r:fw`;
    try {
      for (let i = 0; i < 14; i += 1) await store.consume([hit(key, { limit: 1_000, windowMs: 600_000 })]);
      process.kill(server.pid, 'SIGSTOP');
      for (let failures = 1; failures <= 5; failures += 1)
        expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      // 5 of 19 (26%): closed, and still so once they count, a second after their deadlines (the
      // sixth call is judged a second after its own, so it cannot have counted yet).
      await until(() => service.runner.lateCalls.unanswered === 5, {
        timeoutMs: 5_000,
        what: 'five calls judged failed',
      });
      expect(service.runner.circuitState).toBe('closed');
      // 6 of 20 (30%) opens it or, at the latest, 7 of 21 (33%).
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      expect(await failWhilePaused(store, key)).toBe('RedisTimeoutError');
      await until(() => service.runner.circuitState === 'open', { timeoutMs: 5_000, what: 'the circuit opening' });
    } finally {
      process.kill(server.pid, 'SIGCONT');
      await close();
    }
  });
});

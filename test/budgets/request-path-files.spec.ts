import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../support/demo-process.js';
import { type RedisServer, startRedisServer } from '../support/redis-server.js';

/**
 * Library files one request runs once the app is warm, on Redis with the default options. A ratchet:
 * today's figures, lowered as the request path is folded into fewer files. The target is 12 each.
 * The refused path took one file more with the limiter's step seam (the steps' list, which the
 * rejection log now comes through): within its target, and paid back on the admitted path.
 */
const ADMITTED_FILES_BUDGET = 12;
const REFUSED_FILES_BUDGET = 11;

const PROBE = fileURLToPath(new URL('request-path-probe.mjs', import.meta.url));

/** What the probe prints for a route. */
interface Measured {
  status: number;
  files: string[];
  attempts: number;
  /** What made the last attempt not one request decided by Redis, if every attempt was. */
  disturbed: string[];
}

describe('budget: library files on the request path', () => {
  let server: RedisServer;
  let measured: { admitted: Measured; refused: Measured };

  beforeAll(async () => {
    server = await startRedisServer();
    // Plain node on the built package: V8's coverage names the files as they are loaded.
    const { stdout } = await promisify(execFile)(process.execPath, [PROBE], {
      cwd: ROOT,
      env: { ...process.env, REDIS_URL: server.url },
      timeout: 60_000,
    });
    measured = JSON.parse(stdout.trim().split('\n').at(-1)!) as typeof measured;
  }, 90_000);

  afterAll(() => server?.stop());

  it.each([
    ['admitted', 200, ADMITTED_FILES_BUDGET],
    ['refused', 429, REFUSED_FILES_BUDGET],
  ] as const)('one %s request runs at most its budget of files', (route, status, budget) => {
    const { files, disturbed, attempts } = measured[route];
    console.log(`one ${route} request: ${files.length} library files (budget ${budget})\n  ${files.join('\n  ')}`);
    expect(measured[route].status).toBe(status);
    expect(disturbed, `each of ${attempts} measurements was disturbed`).toEqual([]);
    expect(files.length).toBeLessThanOrEqual(budget);
  });
});

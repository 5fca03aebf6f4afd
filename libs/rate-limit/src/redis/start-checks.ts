import type { LoggerService } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { isCluster } from './is-cluster.js';
import { mastersOf } from './masters.js';
import { unsupportedRedis } from './redis-version.js';
import type { ScriptRunner } from './script-runner.js';
import { ACCESS_PROBE_SCRIPT } from './scripts/access-probe.script.js';

/*
 * What the app's start checks of its Redis, once connected: a server too old for the scripts, and
 * a user the ACL refuses what they run. Said once at the start rather than by every request's error.
 */

/** Says at the start, once, when a server is too old for the scripts, rather than by every request's error. */
export async function checkVersion(
  client: Redis | Cluster,
  describe: () => string,
  logger: LoggerService,
): Promise<void> {
  for (const node of mastersOf(client)) {
    const problem = unsupportedRedis(await node.info('server'));
    if (problem) {
      const where = isCluster(client) ? `${node.options.host}:${node.options.port}` : describe();
      logger.error(`Redis (${where}) ${problem}; until it is upgraded, requests follow the store-error policies`);
      return;
    }
  }
}

/**
 * Runs every command of the scripts once (`ACCESS_PROBE_SCRIPT`) and names those the Redis user
 * may not run (an ACL without one, or without the keys or the channel): the app stops there,
 * rather than each request meeting the refusal, under load. Only in an app that declares rules: an
 * operator's tool (the CLI, run by a read-only user perhaps) runs what its user may.
 * @returns why the app cannot start; undefined when the user may run it all (or the probe told nothing)
 */
export async function checkAccess(
  runner: ScriptRunner,
  keyPrefix: string,
  describe: () => string,
): Promise<string | undefined> {
  const at = `${keyPrefix}:{access-probe}`;
  const refused = await runner
    .runOperation(ACCESS_PROBE_SCRIPT, [`${at}:s`, `${at}:h`, `${at}:z`], [`${keyPrefix}:lifted`])
    .then(
      (reply) => (reply as unknown[]).map(String),
      // Refused whole (no EVALSHA, no keys); anything else (a timeout) tells nothing of the ACL.
      (error: unknown) => (String(error).includes('NOPERM') ? [String(error)] : []),
    );
  if (refused.length === 0) return undefined;
  return (
    `RateLimitModule: Redis (${describe()}) refuses what the rate limiter runs: ${[...new Set(refused)].join('; ')}. ` +
    'Grant the ACL in the docs (operations.md, "A least-privilege Redis user")'
  );
}

#!/usr/bin/env node
/**
 * Changes and watches limits in Redis while the apps run (`RedisConfigCentre`):
 *
 *   nest-rate-limit-limits list
 *   nest-rate-limit-limits get orders.list
 *   nest-rate-limit-limits set orders.list count=5000 window=1m mode=shadow   # field= unsets a field
 *   nest-rate-limit-limits delete orders.list
 *   nest-rate-limit-limits inspect OrdersController.list 203.0.113.7
 *   nest-rate-limit-limits reset OrdersController.list 203.0.113.7
 *
 * Reads REDIS_URL, or REDIS_SENTINELS + REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES, and
 * RATE_LIMIT_PREFIX (default rl), as the apps do. Prints JSON. Exit codes: 0 done, 2 refused (the
 * message names the field), 1 failed.
 */
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { RedisConfigCentre } from '../config-centre/redis-config-centre.js';
import { RateLimitModule } from '../module/rate-limit.module.js';
import { redisOptionsFromEnv } from '../redis/redis-options-from-env.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitManagementService } from './rate-limit-management.service.js';

const USAGE = `usage: nest-rate-limit-limits list
       nest-rate-limit-limits get <configKey>
       nest-rate-limit-limits set <configKey> <field>=<value>...   (fields: count, window, algorithm, mode)
       nest-rate-limit-limits delete <configKey>
       nest-rate-limit-limits inspect <rule> <identity>
       nest-rate-limit-limits reset <rule> <identity>`;

class UsageError extends Error {}

async function run(admin: RateLimitManagementService, [command, ...args]: string[]): Promise<unknown> {
  const want = (count: number) => {
    if (args.length !== count) throw new UsageError(`${command}: takes ${count} argument(s)`);
  };
  switch (command) {
    case 'list':
      want(0);
      return admin.list();
    case 'get':
      want(1);
      return admin.get(args[0]);
    case 'set': {
      if (args.length < 2) throw new UsageError('set: give a config key and at least one field=value');
      const [configKey, ...pairs] = args;
      const values: Record<string, string> = {};
      for (const pair of pairs) {
        const at = pair.indexOf('=');
        if (at <= 0) throw new UsageError(`set: '${pair}' is not field=value`);
        values[pair.slice(0, at)] = pair.slice(at + 1);
      }
      return admin.set(configKey, values);
    }
    case 'delete':
      want(1);
      return { deleted: await admin.delete(args[0]) };
    case 'inspect':
      want(2);
      return admin.inspect(args[0], args[1]);
    case 'reset':
      want(2);
      await admin.reset(args[0], args[1]);
      return { reset: true };
    default:
      throw new UsageError(command ? `unknown command '${command}'` : 'no command');
  }
}

async function main(): Promise<number> {
  const argv = process.argv.slice(2);
  if (argv[0] === '--help' || argv[0] === '-h') {
    console.log(USAGE);
    return 0;
  }
  const redis = redisOptionsFromEnv();
  if (redis === undefined) {
    console.error('Set REDIS_URL, REDIS_SENTINELS or REDIS_CLUSTER_NODES to the Redis the apps use');
    return 2;
  }
  const app = await NestFactory.createApplicationContext(
    RateLimitModule.forRoot({
      redis,
      keyPrefix: process.env.RATE_LIMIT_PREFIX || undefined,
      configCentre: RedisConfigCentre,
      globalGuard: false,
      // An operator's command waits for Redis a little longer than a request does.
      storeErrors: { timeoutMs: 2_000, circuitBreaker: false },
    }),
    { logger: ['error'] },
  );
  try {
    console.log(JSON.stringify(await run(app.get(RateLimitManagementService), argv), null, 2));
    return 0;
  } catch (error) {
    if (error instanceof UsageError) {
      console.error(`${error.message}\n${USAGE}`);
      return 2;
    }
    if (error instanceof RateLimitConfigurationError) {
      console.error(error.message);
      return 2;
    }
    console.error(String(error));
    return 1;
  } finally {
    await app.close();
  }
}

process.exitCode = await main();

#!/usr/bin/env node
/**
 * Changes and watches limits in Redis while the apps run (`RedisConfigCentre`):
 *
 *   nest-rate-limit-limits list
 *   nest-rate-limit-limits get orders.list
 *   nest-rate-limit-limits set orders.list count=5000 window=1m mode=shadow   # field= unsets a field; a window takes a unit
 *   nest-rate-limit-limits delete orders.list
 *   nest-rate-limit-limits inspect OrdersController.list 203.0.113.7
 *   nest-rate-limit-limits reset OrdersController.list 203.0.113.7
 *   nest-rate-limit-limits changes 20                                         # the latest changes, by whom
 *   nest-rate-limit-limits ban '*' 203.0.113.7 for=1h                         # every rule, every instance
 *   nest-rate-limit-limits ban '*' 203.0.113.0/24 for=1h                      # every address in the network
 *   nest-rate-limit-limits set-override demo.config acme count=20000 until=2026-12-31T23:59Z
 *
 * An address given to ban or set-override for a rule counted by address is taken as the apps count
 * it (IPv4-mapped as IPv4, IPv6 per the `ipv6PrefixBits` prefix they catalogue with their rules).
 * Changes are logged with who made them: RATE_LIMIT_ACTOR, else `cli:<the OS user>`.
 * Reads REDIS_URL, or REDIS_SENTINELS + REDIS_SENTINEL_NAME, or REDIS_CLUSTER_NODES, and
 * RATE_LIMIT_PREFIX (default rl), as the apps do. Prints JSON. Exit codes: 0 done, 2 refused (the
 * message names the field), 3 refused by Redis for lack of permission (the message names what),
 * 1 failed (Redis not reachable, say: the message names where it looked).
 */
import 'reflect-metadata';
import { userInfo } from 'node:os';
import { NestFactory } from '@nestjs/core';
import { RateLimitConfigurationError, RateLimitModule } from 'nest-rate-limit';
import {
  RateLimitManagementService,
  RateLimitPermissionError,
  RedisConfigCentre,
  rateLimitManagement,
} from 'nest-rate-limit/live';
import { RedisService, redisOptionsFromEnv } from 'nest-rate-limit/store';

const USAGE = `usage: nest-rate-limit-limits list
       nest-rate-limit-limits get <configKey>
       nest-rate-limit-limits set <configKey> <field>=<value>...   (fields: count, window, algorithm, mode;
                                                                   a window with its unit: 500ms, 30s, 1m, 1h, 1d)
       nest-rate-limit-limits delete <configKey>
       nest-rate-limit-limits inspect <rule> <identity>
       nest-rate-limit-limits reset <rule> <identity>
       nest-rate-limit-limits changes [<count>]                     (the latest live changes, newest first; default 20)
       nest-rate-limit-limits ban <rule|'*'> <identity> for=<duration>|until=<time>
       nest-rate-limit-limits unban <rule|'*'> <identity>
       nest-rate-limit-limits bans
       nest-rate-limit-limits set-override <configKey> <identity> count=<n> window=<duration> for=<duration>|until=<time>
       nest-rate-limit-limits delete-override <configKey> <identity>
       nest-rate-limit-limits overrides
  (set takes allow.addresses=10.0.0.0/8,2001:db8::/32 allow.identities=...
   allow.userAgents=kube-probe@10.0.0.0/8+fd00::/8,...: one allow list; a user agent only with the networks it comes from)`;

class UsageError extends Error {}

/** Who the changes are logged as made by. */
function actor(): string {
  if (process.env.RATE_LIMIT_ACTOR) return process.env.RATE_LIMIT_ACTOR;
  try {
    return `cli:${userInfo().username}`;
  } catch {
    // A container run under a UID with no passwd entry.
    return `cli:${process.env.USER || `uid ${process.getuid?.() ?? 'unknown'}`}`;
  }
}

type Command = (admin: RateLimitManagementService) => Promise<unknown>;

/**
 * `field=value` arguments. `allow.addresses=a,b` (and `allow.identities`, `allow.userAgents`) make
 * up one `allow` list, replacing the key's; `allow=` unsets it. A user agent is written with the
 * networks it comes from, `kube-probe@10.0.0.0/8+fd00::/8`; one without is passed on as it is, for
 * the API to refuse naming the entry.
 */
function fieldsOf(command: string, pairs: readonly string[]): Map<string, unknown> {
  const values = new Map<string, unknown>();
  for (const pair of pairs) {
    const at = pair.indexOf('=');
    if (at <= 0) throw new UsageError(`${command}: '${pair}' is not field=value`);
    const [field, value] = [pair.slice(0, at), pair.slice(at + 1)];
    // A bare number is milliseconds to the API, which an operator typing window=60 rarely means;
    // for= is a duration the API would refuse without its unit, under the name of its own field.
    if (field === 'window' && /^\s*\d+(\.\d+)?\s*$/.test(value)) {
      throw new UsageError(
        `${command}: ${field}=${value} has no unit (a bare number would be ${value.trim()} ms); give one: ${field}=${value.trim()}s, ${field}=500ms, ${field}=1m`,
      );
    }
    if (field === 'for' && /^\s*\d+(\.\d+)?\s*$/.test(value)) {
      throw new UsageError(
        `${command}: for=${value} has no unit; give one: for=${value.trim()}s, for=${value.trim()}m, for=1h, for=7d`,
      );
    }
    if (field.startsWith('allow.')) {
      const allow = (values.get('allow') as Record<string, unknown[]> | undefined) ?? {};
      const name = field.slice('allow.'.length);
      const entries = value.split(',').filter((entry) => entry !== '');
      allow[name] = name === 'userAgents' ? entries.map(userAgentFromNetworks) : entries;
      values.set('allow', allow);
    } else values.set(field, value);
  }
  return values;
}

/** `agent@network+network` as `{ agent, from }`; the last `@` ends the agent, which may hold one. */
function userAgentFromNetworks(entry: string): string | { agent: string; from: string[] } {
  const at = entry.lastIndexOf('@');
  if (at <= 0) return entry;
  return { agent: entry.slice(0, at), from: entry.slice(at + 1).split('+') };
}

/**
 * When a ban or an override ends: `for=<duration>` from now, or `until=<ISO 8601 time>`, passed on
 * as given: the API reads both as it does for every caller (`parseEndTime`), a bare number refused.
 */
function endOf(command: string, fields: Map<string, unknown>): string {
  const span = fields.get('for');
  const until = fields.get('until');
  if ((span === undefined) === (until === undefined)) {
    throw new UsageError(`${command}: give for=<duration> (1h, 7d) or until=<time> (2026-12-31T23:59Z), one of them`);
  }
  return String(span ?? until);
}

/** The command the arguments ask for, checked before Redis is asked anything. */
function parse([command, ...args]: string[]): Command {
  const want = (count: number) => {
    if (args.length !== count) throw new UsageError(`${command}: takes ${count} argument(s)`);
  };
  switch (command) {
    case 'list':
      want(0);
      return (admin) => admin.list();
    case 'get':
      want(1);
      return (admin) => admin.get(args[0]);
    case 'set': {
      if (args.length < 2) throw new UsageError('set: give a config key and at least one field=value');
      const [configKey, ...pairs] = args;
      const values = fieldsOf('set', pairs);
      // Defined, not assigned: a field named __proto__ stays a field, and is refused as one.
      return (admin) => admin.set(configKey, Object.fromEntries(values), { by: actor() });
    }
    case 'ban': {
      if (args.length !== 3)
        throw new UsageError("ban: give a rule (or '*'), an identity, and for=<duration> or until=<time>");
      const [rule, identity, end] = args;
      const until = endOf('ban', fieldsOf('ban', [end]));
      return (admin) => admin.ban(rule, identity, until, { by: actor() });
    }
    case 'unban':
      want(2);
      return async (admin) => ({ unbanned: await admin.unban(args[0], args[1], { by: actor() }) });
    case 'bans':
      want(0);
      return (admin) => admin.bans();
    case 'set-override': {
      if (args.length < 4) {
        throw new UsageError(
          'set-override: give a config key, an identity, count=/window= and for=<duration> or until=<time>',
        );
      }
      const [configKey, identity, ...pairs] = args;
      const fields = fieldsOf('set-override', pairs);
      const until = endOf('set-override', fields);
      fields.delete('for');
      fields.delete('until');
      return (admin) => admin.setOverride(configKey, identity, Object.fromEntries(fields), until, { by: actor() });
    }
    case 'delete-override':
      want(2);
      return async (admin) => ({ deleted: await admin.deleteOverride(args[0], args[1], { by: actor() }) });
    case 'overrides':
      want(0);
      return (admin) => admin.overrides();
    case 'delete':
      want(1);
      return async (admin) => ({ deleted: await admin.delete(args[0], { by: actor() }) });
    case 'inspect':
      want(2);
      return (admin) => admin.inspect(args[0], args[1]);
    case 'reset':
      want(2);
      return async (admin) => {
        await admin.reset(args[0], args[1], { by: actor() });
        return { reset: true };
      };
    case 'changes': {
      if (args.length > 1) throw new UsageError('changes: takes at most 1 argument');
      const count = args.length === 0 ? 20 : Number(args[0]);
      if (!(Number.isInteger(count) && count >= 1 && count <= 1_000)) {
        throw new UsageError(`changes: the count must be a whole number from 1 to 1000, got '${args[0]}'`);
      }
      return (admin) => admin.changeLog(count);
    }
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
  let command: Command;
  try {
    command = parse(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    console.error(`${error.message}\n${USAGE}`);
    return 2;
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
      extensions: [rateLimitManagement()],
      globalGuard: false,
      // An operator's command waits for Redis a little longer than a request does.
      storeErrors: { timeoutMs: 2_000, circuitBreaker: false },
    }),
    // Held back until Redis answers: when it does not, one line says where it was looked for,
    // instead of the connection's error and the command's ("Stream isn't writeable…").
    { logger: ['error'], bufferLogs: true },
  );
  try {
    const service = app.get(RedisService);
    if (!(await service.reachable())) {
      const variable = redisVariable();
      const where = variable === 'REDIS_CLUSTER_NODES' ? `cluster nodes ${process.env[variable]}` : service.describe();
      console.error(
        `Cannot reach Redis at ${where} (from ${variable}): is it running, and is ${variable} the address the apps use (with their password, or rediss:// for TLS)?`,
      );
      return 1;
    }
    app.flushLogs();
    console.log(JSON.stringify(await command(app.get(RateLimitManagementService)), null, 2));
    return 0;
  } catch (error) {
    if (error instanceof RateLimitConfigurationError) {
      console.error(error.message);
      return 2;
    }
    if (error instanceof RateLimitPermissionError) {
      console.error(error.message);
      return 3;
    }
    console.error(String(error));
    return 1;
  } finally {
    await app.close();
  }
}

/** The variable `redisOptionsFromEnv` took the connection from (it looks in this order). */
function redisVariable(): 'REDIS_CLUSTER_NODES' | 'REDIS_SENTINELS' | 'REDIS_URL' {
  if (process.env.REDIS_CLUSTER_NODES) return 'REDIS_CLUSTER_NODES';
  return process.env.REDIS_SENTINELS ? 'REDIS_SENTINELS' : 'REDIS_URL';
}

process.exitCode = await main();

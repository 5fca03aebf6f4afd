/**
 * What keeping one identity's windows together in Redis would cost and gain, against the layout the
 * library uses: one key per rule and identity (`rl:{id}:<rule>:fw`, a plain counter timed by its
 * TTL, decided by the fast script: TIME, then INCRBY and PEXPIRETIME per rule, and a DECRBY per
 * rule to take back a refusal), or one hash per identity holding every rule's count and window end
 * as fields (a script written for this measurement only: TIME, one HMGET, and an HSET when it
 * admits, with a PEXPIREAT GT when a window starts; Redis 7.0 has no expiry per hash field, so each
 * window's end is a field and the key lives as long as its longest window).
 *
 * Both decide the same thing for fixed windows: the library's store as it ships (its store call, as
 * `nest-rate-limit/store` gives it), the other as a candidate called straight through ioredis. So
 * Redis's side compares like with like (its CPU per decision, its memory per identity) and the
 * app's does not: decisions per second include the library's app side for the first only. One,
 * three and five rules per identity, 10,000 identities, 16 calls in flight, each layout in turn for
 * three rounds (medians), then Redis memory per identity.
 *
 *   npm run bench:identity-layout
 */
import { Redis } from 'ioredis';
import { startRedisServer } from '../test/support/redis-server.js';
import { createStore, hit } from '../test/support/store-module.js';
import { measureDecisions } from './support/measure-decisions.js';
import { REDIS_MEMORY_ARGS, redisBytesPerKey } from './support/redis-memory.js';

const IDENTITIES = 10_000;
/** Decisions per measurement, and a bound in time whichever comes first. */
const CALLS = 60_000;
const MAX_MS = 4_000;
const IN_FLIGHT = 16;
const ROUNDS = 3;
/** Windows of the rules, in turn: a minute, an hour, a day, then again. */
const WINDOWS_MS = [60_000, 3_600_000, 86_400_000, 60_000, 3_600_000];
const HUGE = 1_000_000_000;

/**
 * One hash per identity: per rule a count field and a window-end field (ms). ARGV per rule: the two
 * field names, limit, window, cost.
 */
const HASH_LUA = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rules = #ARGV / 5
local fields = {}
for i = 1, rules do
  fields[2 * i - 1], fields[2 * i] = ARGV[5 * i - 4], ARGV[5 * i - 3]
end
local values = redis.call('HMGET', KEYS[1], unpack(fields))
local counts, ends, all, started = {}, {}, true, false
for i = 1, rules do
  local limit, window, cost = tonumber(ARGV[5 * i - 2]), tonumber(ARGV[5 * i - 1]), tonumber(ARGV[5 * i])
  local count, windowEnd = tonumber(values[2 * i - 1]) or 0, tonumber(values[2 * i])
  if not windowEnd or windowEnd <= now then
    count, windowEnd, started = 0, now + window, true
  end
  counts[i], ends[i] = count + cost, windowEnd
  if counts[i] > limit then all = false end
end
local out = { now }
if all then
  local set, last = {}, 0
  for i = 1, rules do
    set[4 * i - 3], set[4 * i - 2], set[4 * i - 1], set[4 * i] = fields[2 * i - 1], counts[i], fields[2 * i], ends[i]
    if ends[i] > last then last = ends[i] end
  end
  redis.call('HSET', KEYS[1], unpack(set))
  -- GT leaves a key without a TTL as it is: the first window gives it one.
  if started and redis.call('PEXPIREAT', KEYS[1], last, 'GT') == 0 and redis.call('PTTL', KEYS[1]) == -1 then
    redis.call('PEXPIREAT', KEYS[1], last)
  end
end
for i = 1, rules do
  out[i + 1] = counts[i] * (tonumber(ARGV[5 * i - 1]) + 1) + math.max(1, ends[i] - now)
end
return out`;

type Layout = (identity: number, rules: number) => Promise<unknown>;

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];

async function main(): Promise<void> {
  const server = await startRedisServer(REDIS_MEMORY_ARGS);
  const client = new Redis(server.url);
  const { store, close } = await createStore({ redis: server.url });
  const hashSha = String(await client.script('LOAD', HASH_LUA));
  const ruleId = (i: number) => `r${i}~abcdef`;
  const layouts: Record<string, Layout> = {
    'a key per rule (the library)': (identity, rules) =>
      store.consume(
        WINDOWS_MS.slice(0, rules).map((windowMs, i) =>
          hit(`rl:{${identity}}:${ruleId(i)}:fw`, { limit: HUGE, windowMs }),
        ),
      ),
    'a hash per identity': (identity, rules) => {
      const args = WINDOWS_MS.slice(0, rules).flatMap((window, i) => [
        `${ruleId(i)}:c`,
        `${ruleId(i)}:e`,
        HUGE,
        window,
        1,
      ]);
      return client.evalsha(hashSha, 1, `rl:{${identity}}:rules`, ...args);
    },
  };

  const measure = (layout: Layout, rules: number) =>
    measureDecisions(client, (identity) => layout(identity, rules), {
      inFlight: IN_FLIGHT,
      keys: IDENTITIES,
      calls: CALLS,
      maxMs: MAX_MS,
    });

  console.log(`### One identity's rules: ${IDENTITIES.toLocaleString('en')} identities, ${IN_FLIGHT} in flight\n`);
  console.log('| layout | rules | decisions/s | Redis µs/decision | Redis bytes per identity |');
  console.log('|---|---|---|---|---|');
  for (const rules of [1, 3, 5]) {
    const results = new Map<string, { perSecond: number[]; redisUs: number[] }>();
    for (let round = 0; round < ROUNDS; round += 1) {
      const names = Object.keys(layouts);
      for (const name of round % 2 === 0 ? names : names.reverse()) {
        await client.flushall();
        await measure(layouts[name], rules); // every identity's windows started, as in steady traffic
        const { perSecond, redisUs } = await measure(layouts[name], rules);
        const seen = results.get(name) ?? { perSecond: [], redisUs: [] };
        seen.perSecond.push(perSecond);
        seen.redisUs.push(redisUs);
        results.set(name, seen);
      }
    }
    for (const [name, layout] of Object.entries(layouts)) {
      const { perSecond, redisUs } = results.get(name)!;
      const bytes = await redisBytesPerKey(client, (identity) => layout(identity, rules));
      console.log(
        `| ${name} | ${rules} | ${Math.round(median(perSecond))} | ${median(redisUs).toFixed(1)} | ${Math.round(bytes)} |`,
      );
    }
  }
  await close();
  client.disconnect();
  await server.stop();
}

void main();

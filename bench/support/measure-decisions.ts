import type { Redis } from 'ioredis';
import { redisCpuUs } from './redis-cpu.js';

/** One decision for the key given (a number: the bench names its keys from it). */
export type Decide = (key: number) => Promise<unknown>;

/** What one measurement saw, per decision made. */
export interface DecisionsMeasured {
  perSecond: number;
  p99Ms: number;
  /** This process's CPU: the load loop's share is the same for every contender. */
  nodeUs: number;
  /** The server's `used_cpu_user + used_cpu_sys` over the same decisions. */
  redisUs: number;
}

/**
 * Makes up to `calls` decisions, or as many as `maxMs` allows, whichever comes first, with
 * `inFlight` outstanding at once over `keys` keys in turn.
 */
export async function measureDecisions(
  client: Redis,
  decide: Decide,
  { inFlight, keys, calls, maxMs }: { inFlight: number; keys: number; calls: number; maxMs: number },
): Promise<DecisionsMeasured> {
  const latencies: number[] = [];
  let next = 0;
  const redisBefore = await redisCpuUs(client);
  const cpuBefore = process.cpuUsage();
  const started = performance.now();
  const deadline = started + maxMs;
  const worker = async () => {
    while (next < calls && performance.now() < deadline) {
      const key = next % keys;
      next += 1;
      const at = performance.now();
      await decide(key);
      latencies.push(performance.now() - at);
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
  const elapsed = performance.now() - started;
  const cpu = process.cpuUsage(cpuBefore);
  const redisUs = (await redisCpuUs(client)) - redisBefore;
  latencies.sort((a, b) => a - b);
  const n = latencies.length;
  return {
    perSecond: (n / elapsed) * 1000,
    p99Ms: latencies[Math.floor(n * 0.99)] ?? 0,
    nodeUs: (cpu.user + cpu.system) / n,
    redisUs: redisUs / n,
  };
}

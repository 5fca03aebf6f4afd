import type { Redis } from 'ioredis';

/** The CPU a Redis server has used so far (`used_cpu_user + used_cpu_sys`), in µs. */
export async function redisCpuUs(client: Redis): Promise<number> {
  const info = await client.info('cpu');
  const field = (name: string) => Number(new RegExp(`${name}:([\\d.]+)`).exec(info)?.[1] ?? 0);
  return (field('used_cpu_user') + field('used_cpu_sys')) * 1e6;
}

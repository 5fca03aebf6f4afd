import type { Registry } from 'prom-client';
import type { LiveConfigState } from '../live/redis-config-centre.js';

/** prom-client, loaded when the app starts (`rateLimitMetrics()`): an app without metrics need not have it. */
export type PromClient = typeof import('prom-client');

/** A counter whose totals are kept elsewhere, as plain numbers, and brought up to date when it is scraped. */
export function collectedCounter<T extends string>(
  client: PromClient,
  registers: Registry[],
  name: string,
  help: string,
  labelNames: readonly T[],
  totals: () => Iterable<[Partial<Record<T, string>>, number]>,
): void {
  const seen = new Map<string, number>();
  new client.Counter({
    name,
    help,
    labelNames,
    registers,
    collect() {
      for (const [labels, total] of totals()) {
        const id = JSON.stringify(labels);
        const last = seen.get(id);
        // A series is exposed from the first scrape that meets it, at 0 if nothing was counted yet.
        if (last === undefined || total > last) this.inc(labels, total - (last ?? 0));
        seen.set(id, total);
      }
    },
  });
}

/** The live limits' metrics, for a config centre that has them (`RedisConfigCentre`). */
export function liveConfigMetrics(
  client: PromClient,
  registers: Registry[],
  prefix: string,
  liveConfig: () => LiveConfigState | undefined,
): void {
  if (!liveConfig()) return;
  const total = (field: 'reloads' | 'refused') => (): [object, number][] => [[{}, liveConfig()?.[field] ?? 0]];
  const reloads = 'Full reads of the live limits (at start, after a gap, periodically)';
  collectedCounter(client, registers, `${prefix}config_reloads_total`, reloads, [], total('reloads'));
  const refused = 'Live limit values refused as invalid (the last good value stayed)';
  collectedCounter(client, registers, `${prefix}config_refused_total`, refused, [], total('refused'));
  new client.Gauge({
    name: `${prefix}config_in_sync`,
    help: 'Whether news of every live limit change reaches this instance (1) or may be missed (0)',
    registers,
    collect() {
      this.set(liveConfig()?.inSync ? 1 : 0);
    },
  });
}

/**
 * Kept only for `bench/failover.measure.ts`, which still imports these names: the generator itself
 * is `paced` in `traffic.ts`. Delete this file once the benchmark imports from there.
 */
import { type PacedEvent, type PacedSample, type Send, admittedPerWindow, paced } from './traffic.js';

export { type PacedEvent, type PacedSample, admittedPerWindow };

/** `paced(...)` as an array of samples. */
export async function pacedTraffic(options: {
  durationMs: number;
  ratePerS: number;
  send: Send;
  events?: PacedEvent[];
}): Promise<PacedSample[]> {
  return (await paced(options)).samples;
}

import type { Response } from 'supertest';

/** One request of a paced run. */
export interface PacedSample {
  /** When it was due, in ms from the start. */
  due: number;
  /** When its answer came, in ms from the start. */
  answeredAt: number;
  status: number;
  /** Redis decided it (the `RateLimit-*` headers are sent only for store decisions). */
  fromRedis: boolean;
}

export interface PacedEvent {
  /** Run once the first request due at or after this many ms is reached. */
  atMs: number;
  run: () => Promise<unknown>;
  /** Keep sending while it runs, instead of holding the traffic until it is done. */
  inBackground?: boolean;
}

/**
 * Sends `ratePerS` requests per second, evenly, for `durationMs` of real time (a bounded count),
 * running each event when its time comes; resolves with every request's outcome.
 */
export async function pacedTraffic(options: {
  durationMs: number;
  ratePerS: number;
  send: (index: number) => Promise<Response>;
  events?: PacedEvent[];
}): Promise<PacedSample[]> {
  const { durationMs, ratePerS, send } = options;
  const events = [...(options.events ?? [])].sort((a, b) => a.atMs - b.atMs);
  const samples: PacedSample[] = [];
  const pending: Promise<unknown>[] = [];
  const started = performance.now();
  for (let i = 0; i < (durationMs / 1000) * ratePerS; i += 1) {
    const due = (i * 1000) / ratePerS;
    const wait = due - (performance.now() - started);
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    while (events.length > 0 && events[0].atMs <= due) {
      const event = events.shift()!;
      if (event.inBackground) pending.push(event.run());
      else await event.run();
    }
    pending.push(
      send(i).then((response) => {
        samples.push({
          due,
          answeredAt: performance.now() - started,
          status: response.status,
          fromRedis: response.headers['ratelimit-limit'] !== undefined,
        });
      }),
    );
  }
  await Promise.all(pending);
  return samples;
}

/** Requests admitted in each of `windows` consecutive windows of `windowMs` from the start. */
export function admittedPerWindow(samples: readonly PacedSample[], windowMs: number, windows: number): number[] {
  return Array.from(
    { length: windows },
    (_, w) => samples.filter((s) => s.status === 200 && s.due >= w * windowMs && s.due < (w + 1) * windowMs).length,
  );
}

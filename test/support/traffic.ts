import type { INestApplication } from '@nestjs/common';
import request from 'supertest';

/**
 * The one traffic generator of the HTTP suites: requests one after another, a concurrent burst, or
 * a steady rate. Every run is bounded in count, and sequential and paced runs in time as well (a
 * burst sends everything at once, so only its answers take time). Requests are made by `send`, so
 * the same runs work through supertest, a keep-alive agent or several app instances.
 */

/** What a request resolves to: a supertest response, or anything else with a status and headers. */
export interface Answer {
  readonly status: number;
  readonly headers: Readonly<Record<string, unknown>>;
}

/** Sends the `index`-th request of a run (from 0). */
export type Send = (index: number) => PromiseLike<Answer>;

/** One request of a run. Times are ms from the start of the run. */
export interface Sample {
  index: number;
  sentAt: number;
  answeredAt: number;
  status: number;
  /** Redis decided it: the `RateLimit-*` headers (the default style) are sent only for store decisions. */
  fromRedis: boolean;
}

/** One request of a paced run. */
export interface PacedSample extends Sample {
  /** When the schedule had it due; it is sent then, or as soon after as the event loop allows. */
  due: number;
}

export interface Traffic<S extends Sample = Sample> {
  /** Every request, in the order of their indexes. */
  readonly samples: S[];
  /** Their statuses, in the same order. */
  readonly statuses: number[];
  /** How many answers had `status`. */
  count(status: number): number;
}

function traffic<S extends Sample>(samples: S[]): Traffic<S> {
  const ordered = [...samples].sort((a, b) => a.index - b.index);
  const statuses = ordered.map((sample) => sample.status);
  return {
    samples: ordered,
    statuses,
    count: (status) => statuses.filter((s) => s === status).length,
  };
}

function measure(send: Send, index: number, started: number): Promise<Sample> {
  const sentAt = performance.now() - started;
  // `then` right away: supertest starts a request only once it is awaited, and `await` would do that
  // a microtask later, after whatever the caller does next (another client's request, say).
  const answered = new Promise<Answer>((resolve, reject) => send(index).then(resolve, reject));
  return answered.then((answer) => ({
    index,
    sentAt,
    answeredAt: performance.now() - started,
    status: answer.status,
    fromRedis: answer.headers['ratelimit-limit'] !== undefined,
  }));
}

/**
 * Sends up to `count` requests one after another, each once the previous one is answered. With
 * `clients`, that many such senders run side by side and share the count; with `durationMs`, none
 * starts a request after that long.
 */
export async function sequential(
  count: number,
  send: Send,
  { clients = 1, durationMs = Number.POSITIVE_INFINITY }: { clients?: number; durationMs?: number } = {},
): Promise<Traffic> {
  const samples: Sample[] = [];
  const started = performance.now();
  let next = 0;
  const client = async () => {
    while (next < count && performance.now() - started < durationMs) {
      samples.push(await measure(send, next++, started));
    }
  };
  await Promise.all(Array.from({ length: clients }, client));
  return traffic(samples);
}

/** Sends `count` requests at once and waits for every answer. */
export async function burst(count: number, send: Send): Promise<Traffic> {
  const started = performance.now();
  return traffic(await Promise.all(Array.from({ length: count }, (_, i) => measure(send, i, started))));
}

/** Something to do while paced traffic runs. */
export interface PacedEvent {
  /** Run once the first request due at or after this many ms is reached. */
  atMs: number;
  run: () => Promise<unknown>;
  /** Keep sending while it runs, instead of holding the traffic until it is done. */
  inBackground?: boolean;
}

/**
 * Sends `ratePerS` requests per second, evenly, for `durationMs` of real time (so a bounded count),
 * without waiting for answers, and runs each event when its time comes; resolves once every request
 * is answered and every event is done.
 */
export async function paced({
  durationMs,
  ratePerS,
  send,
  events = [],
}: {
  durationMs: number;
  ratePerS: number;
  send: Send;
  events?: readonly PacedEvent[];
}): Promise<Traffic<PacedSample>> {
  const waiting = [...events].sort((a, b) => a.atMs - b.atMs);
  const pending: Promise<unknown>[] = [];
  const samples: PacedSample[] = [];
  const started = performance.now();
  for (let i = 0; i < (durationMs / 1000) * ratePerS; i += 1) {
    const due = (i * 1000) / ratePerS;
    const wait = due - (performance.now() - started);
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    while (waiting.length > 0 && waiting[0].atMs <= due) {
      const event = waiting.shift()!;
      if (event.inBackground) pending.push(event.run());
      else await event.run();
    }
    pending.push(measure(send, i, started).then((sample) => samples.push({ ...sample, due })));
  }
  await Promise.all(pending);
  return traffic(samples);
}

/** Requests admitted in each of `windows` consecutive windows of `windowMs` from the start, by when they were due. */
export function admittedPerWindow(samples: readonly PacedSample[], windowMs: number, windows: number): number[] {
  return Array.from(
    { length: windows },
    (_, w) => samples.filter((s) => s.status === 200 && s.due >= w * windowMs && s.due < (w + 1) * windowMs).length,
  );
}

/** Sends `n` GET requests to `path` one after another and returns their statuses. */
export async function statuses(
  app: INestApplication,
  path: string,
  n: number,
  headers: Record<string, string> = {},
): Promise<number[]> {
  return (await sequential(n, () => request(app.getHttpServer()).get(path).set(headers))).statuses;
}

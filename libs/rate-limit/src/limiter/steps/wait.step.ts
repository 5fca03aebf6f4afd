import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import { type RateLimitDecision, unaskedDecision } from '../../store/rate-limit-store.js';
import type { LimitedRequest } from '../limited-request.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitOutcome } from '../rate-limit-outcome.js';
import { type GaveUp, OUT_OF_TIME_RETRY_MS, WaitQueue, paceOf } from './wait-queue.js';

/** Requests waiting in one instance over every key: past it, a request is refused at once. */
const MAX_WAITERS = 10_000;
/** Spread over the instances' heads that wake for the same room, so that none always comes first. */
const JITTER_MS = 20;
/**
 * Spread over the heads woken by the store's news of one release: every instance hears it at about
 * the same time, the one that gave the room back included, which would otherwise come first.
 */
const WAKE_JITTER_MS = 4;

/**
 * Rules with `wait`: a request they would refuse waits for room instead, up to `wait.maxMs`, in
 * arrival order per key within this instance (`WaitQueue`). The head of a key's queue asks the
 * store and sleeps until the refusal's reset (a rate), or until room is given back (here, or on
 * another instance as the store's news tells) or the cap's retry time of a second (a cap); the
 * others wait for their turn, without a store call. A request that would wait past its `maxMs` by
 * the store's answer, or finds its key's queue full, is refused at once; one whose client leaves
 * stops waiting and is refused, holding nothing. Rules without `wait` refuse as ever: a refusal by
 * one of them is final. How long a request waited is `outcome.waitedMs`.
 */
export class WaitStep implements LimiterStep {
  /** Each queue, by the key of its requests' first waiting rule. */
  private readonly queues = new Map<string, WaitQueue>();
  /** The queues whose requests wait on each key (a cap shared by several queues' keys among them): whom its room wakes. */
  private readonly wakes = new Map<string, Set<WaitQueue>>();
  /** Requests waiting, heads included. */
  private waiters = 0;
  /** Requests that came with a waiting rule, counted: their order of arrival. */
  private arrivals = 0;
  /** Room given back, counted: a release while a request's first call was out may not be in its answer. */
  private releases = 0;
  /** Whether the store's news of releases reaches this instance (`heard`); if not, releases here wake its heads. */
  private newsHeard = false;
  private readonly waited = new WeakMap<ResilientConsumption, number>();

  async consume(
    prepared: readonly PreparedRule[],
    next: Consume,
    request: LimitedRequest | undefined,
  ): Promise<ResilientConsumption> {
    const waiting = prepared.filter(({ rule, thresholds }) => rule.wait !== undefined && thresholds.mode !== 'shadow');
    if (waiting.length === 0) return next(prepared);
    const started = performance.now();
    const ticket = (this.arrivals += 1);
    const key = waiting[0].hit.key;
    const releases = this.releases;
    // While no one of this key waits here, a request asks at once: a queue only orders waiters.
    const first = this.queues.has(key) ? undefined : await next(prepared);
    if (first && (first.allowed || first.storeError || roomIn(prepared, first) === undefined)) return first;
    const maxQueued = Math.min(...waiting.map(({ rule }) => rule.wait!.maxQueued));
    let queue = this.queues.get(key);
    // Gone already (its close will not come again), or no room to wait in.
    if (request?.gone()) return first ?? refusedUnasked(prepared, waiting, 'gone');
    if ((queue && queue.size >= maxQueued) || this.waiters >= MAX_WAITERS) {
      return first ?? refusedUnasked(prepared, waiting, { roomInMs: OUT_OF_TIME_RETRY_MS });
    }
    if (!queue) queue = this.open(key, waiting, this.releases !== releases);
    const deadline = started + Math.min(...waiting.map(({ rule }) => rule.wait!.maxMs));
    const onGone = request ? (listener: () => void) => request.onGone(listener) : neverGone;
    // The head of a queue made just now: `first` is its answer already.
    const known = queue.idle ? first : undefined;
    // Counted until it leaves, as the head too: heads of many keys are waiters as much as those behind.
    this.waiters += 1;
    try {
      const gaveUp = await queue.turn(ticket, deadline, started, onGone);
      if (gaveUp)
        return first ? this.waitedFor(first, started) : this.stoppedWaiting(prepared, waiting, gaveUp, started);
      const head: HeadOf = { ticket, deadline, started, known, heading: true };
      try {
        return await this.asHead(prepared, waiting, next, queue, head, request);
      } finally {
        // The next one's turn; unless this one gave way and then stopped waiting before its turn came.
        if (head.heading) queue.next();
      }
    } finally {
      this.waiters -= 1;
      if (queue.idle) this.discard(key, queue);
    }
  }

  decided(outcome: RateLimitOutcome, _prepared: readonly PreparedRule[], consumption?: ResilientConsumption): void {
    const waitedMs = consumption && this.waited.get(consumption);
    if (waitedMs !== undefined) outcome.waitedMs = waitedMs;
  }

  /**
   * Room given back here (a slot, a refund, a reset): the heads waiting on those keys ask again; but
   * while the store's news reaches this instance they wait for it, as every other instance does.
   */
  released(keys: readonly string[]): void {
    this.releases += 1;
    if (!this.newsHeard) this.wake(keys, 0);
  }

  /** The store's news of room given back on any instance (`watchLiftedKeys`). */
  heard(keys: readonly string[]): void {
    this.releases += 1;
    this.wake(keys, WAKE_JITTER_MS);
  }

  /** Whether the store's news reaches this instance now. */
  listening(on: boolean): void {
    this.newsHeard = on;
  }

  private wake(keys: readonly string[], jitterMs: number): void {
    for (const key of keys) for (const queue of this.wakes.get(key) ?? []) queue.release(Math.random() * jitterMs);
  }

  /** A queue for `key`, woken by room on any of its waiting rules' keys. */
  private open(key: string, waiting: readonly PreparedRule[], releasedMeanwhile: boolean): WaitQueue {
    const queue = new WaitQueue(waiting.map(({ hit }) => hit.key));
    this.queues.set(key, queue);
    for (const wakeKey of queue.keys) {
      let queues = this.wakes.get(wakeKey);
      if (!queues) this.wakes.set(wakeKey, (queues = new Set()));
      queues.add(queue);
    }
    if (releasedMeanwhile) queue.release();
    return queue;
  }

  private discard(key: string, queue: WaitQueue): void {
    if (this.queues.get(key) === queue) this.queues.delete(key);
    for (const wakeKey of queue.keys) {
      const queues = this.wakes.get(wakeKey);
      queues?.delete(queue);
      if (queues?.size === 0) this.wakes.delete(wakeKey);
    }
  }

  /** Asks, and while only waiting rules refuse and time is left, sleeps until room may be there. */
  private async asHead(
    prepared: readonly PreparedRule[],
    waiting: readonly PreparedRule[],
    next: Consume,
    queue: WaitQueue,
    head: HeadOf,
    request: LimitedRequest | undefined,
  ): Promise<ResilientConsumption> {
    const { ticket, deadline, started, known } = head;
    for (let attempt = 0; ; attempt += 1) {
      let consumption = attempt === 0 ? known : undefined;
      if (!consumption) {
        // No call for a request that left, or whose time ran out before its turn to ask.
        if (request?.gone()) return this.stoppedWaiting(prepared, waiting, 'gone', started);
        if (performance.now() >= deadline) {
          return this.stoppedWaiting(prepared, waiting, { roomInMs: OUT_OF_TIME_RETRY_MS }, started);
        }
        queue.asking();
        consumption = await next(prepared);
      }
      const now = performance.now();
      const roomInMs = consumption.storeError ? undefined : roomIn(prepared, consumption);
      if (consumption.allowed || roomInMs === undefined || now >= deadline || request?.gone()) {
        return this.waitedFor(consumption, started);
      }
      const pace = paceOf(waiting, roomInMs, now);
      queue.learned(pace, now);
      // Known to come too late: refused now, not at the deadline.
      if (pace && pace.roomAt > deadline) return this.waitedFor(consumption, started);
      // A cap's refusal says to retry in a second: sooner, a slot given back wakes the head (here,
      // or on another instance as the store's news tells).
      const sleepMs = roomInMs + Math.random() * JITTER_MS;
      const onGone = request ? (listener: () => void) => request.onGone(listener) : neverGone;
      await queue.sleep(Math.max(0, Math.min(sleepMs, deadline - now)), onGone);
      const gaveUp = await queue.giveWay(ticket, deadline, performance.now(), onGone);
      if (gaveUp) {
        head.heading = false;
        return this.stoppedWaiting(prepared, waiting, gaveUp, started);
      }
    }
  }

  /** The answer of a request that waited from `started`: how long, for `outcome.waitedMs`. */
  private waitedFor(consumption: ResilientConsumption, started: number): ResilientConsumption {
    const waitedMs = Math.round(performance.now() - started);
    if (waitedMs >= 1) this.waited.set(consumption, waitedMs);
    return consumption;
  }

  private stoppedWaiting(
    prepared: readonly PreparedRule[],
    waiting: readonly PreparedRule[],
    gaveUp: GaveUp,
    started: number,
  ): ResilientConsumption {
    return this.waitedFor(refusedUnasked(prepared, waiting, gaveUp), started);
  }
}

/** The head of a queue: its arrival, its deadline and start, its first answer if it has one. */
interface HeadOf {
  readonly ticket: number;
  readonly deadline: number;
  readonly started: number;
  readonly known: ResilientConsumption | undefined;
  /** Whether it holds the queue's turn: false once it gave way and stopped waiting before its turn. */
  heading: boolean;
}

/**
 * How long until the refusing rules may have room, when every refusal is a waiting rule's; undefined
 * when a rule without `wait` refused (final), or a shadowed rule alone did.
 */
function roomIn(prepared: readonly PreparedRule[], consumption: ResilientConsumption): number | undefined {
  let roomInMs: number | undefined;
  for (const [i, decision] of consumption.decisions.entries()) {
    const { rule, thresholds } = prepared[i];
    if (decision.allowed || thresholds.mode === 'shadow') continue;
    if (rule.wait === undefined) return undefined;
    roomInMs = Math.max(roomInMs ?? 0, decision.resetMs);
  }
  return roomInMs;
}

/** A refusal made here, without a store call, for a request that stopped waiting before asking. */
function refusedUnasked(
  prepared: readonly PreparedRule[],
  waiting: readonly PreparedRule[],
  gaveUp: GaveUp,
): ResilientConsumption {
  const resetMs = gaveUp === 'gone' ? 1_000 : Math.max(1, Math.ceil(gaveUp.roomInMs));
  const decisions = prepared.map(({ hit }, i): RateLimitDecision => {
    if (!waiting.includes(prepared[i])) return unaskedDecision(hit);
    return { allowed: false, limit: hit.limit, remaining: 0, resetMs };
  });
  return { allowed: false, decisions, receipts: undefined };
}

function neverGone(): () => void {
  return () => undefined;
}

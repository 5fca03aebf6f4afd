import type { ResilientConsumption } from '../../resilience/deciding-store.js';
import { type RateLimitDecision, unaskedDecision } from '../../store/rate-limit-store.js';
import type { LimitedRequest } from '../limited-request.js';
import type { Consume, LimiterStep } from '../limiter-step.js';
import type { PreparedRule } from '../prepare-hits.js';
import type { RateLimitOutcome } from '../rate-limit-outcome.js';
import { type GaveUp, WaitQueue, paceOf } from './wait-queue.js';

/** Requests waiting in one instance over every key: past it, a request is refused at once. */
const MAX_WAITERS = 10_000;
/** Spread over the instances' heads that wake for the same room, so that none always comes first. */
const JITTER_MS = 20;

/**
 * Rules with `wait`: a request they would refuse waits for room instead, up to `wait.maxMs`, in
 * arrival order per key within this instance (`WaitQueue`). The head of a key's queue asks the
 * store and sleeps until the refusal's reset (a rate), or until a slot is given back here or a short
 * cap's retry time (a second); the others wait for their turn, without a store call. A request that would wait
 * past its `maxMs` by the store's answer, or finds its key's queue full, is refused at once; one
 * whose client leaves stops waiting and is refused, holding nothing. Rules without `wait` refuse as
 * ever: a refusal by one of them is final. How long a request waited is `outcome.waitedMs`.
 */
export class WaitStep implements LimiterStep {
  private readonly queues = new Map<string, WaitQueue>();
  private waiters = 0;
  /** Requests that came with a waiting rule, counted: their order of arrival. */
  private arrivals = 0;
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
    // While no one of this key waits here, a request asks at once: a queue only orders waiters.
    const first = this.queues.has(key) ? undefined : await next(prepared);
    if (first && (first.allowed || first.storeError || roomIn(prepared, first) === undefined)) return first;
    let queue = this.queues.get(key);
    if (!queue) this.queues.set(key, (queue = new WaitQueue()));
    const deadline = started + Math.min(...waiting.map(({ rule }) => rule.wait!.maxMs));
    const onGone = request ? (listener: () => void) => request.onGone(listener) : neverGone;
    // The head of a queue made just now: `first` is its answer already.
    const known = queue.idle ? first : undefined;
    const maxQueued = Math.min(...waiting.map(({ rule }) => rule.wait!.maxQueued));
    if (queue.size >= maxQueued || this.waiters >= MAX_WAITERS) {
      if (queue.idle) this.queues.delete(key);
      return first ?? refusedUnasked(prepared, waiting, { roomInMs: 1_000 });
    }
    // Counted until it leaves, as the head too: heads of many keys are waiters as much as those behind.
    this.waiters += 1;
    try {
      const gaveUp = await queue.turn(ticket, deadline, started, onGone);
      if (gaveUp) return first ?? refusedUnasked(prepared, waiting, gaveUp);
      const head: HeadOf = { ticket, deadline, started, known, heading: true };
      try {
        return await this.asHead(prepared, waiting, next, queue, head, request);
      } finally {
        // The next one's turn; unless this one gave way and then stopped waiting before its turn came.
        if (head.heading) queue.next();
      }
    } finally {
      this.waiters -= 1;
      if (queue.idle) this.queues.delete(key);
    }
  }

  decided(outcome: RateLimitOutcome, _prepared: readonly PreparedRule[], consumption?: ResilientConsumption): void {
    const waitedMs = consumption && this.waited.get(consumption);
    if (waitedMs !== undefined) outcome.waitedMs = waitedMs;
  }

  /** Room given back here (a slot, a refund, a reset): the heads waiting on those keys ask again. */
  released(keys: readonly string[]): void {
    for (const key of keys) this.queues.get(key)?.release();
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
      if (attempt > 0 || !known) queue.asking();
      const consumption = attempt === 0 && known ? known : await next(prepared);
      const now = performance.now();
      const roomInMs = consumption.storeError ? undefined : roomIn(prepared, consumption);
      if (consumption.allowed || roomInMs === undefined || now >= deadline || request?.gone()) {
        if (now - started >= 1) this.waited.set(consumption, Math.round(now - started));
        return consumption;
      }
      const pace = paceOf(waiting, roomInMs, now);
      queue.learned(pace, now);
      // Known to come too late: refused now, not at the deadline.
      if (pace && pace.roomAt > deadline) return consumption;
      // A cap's refusal says to retry in a second: sooner, a slot given back wakes the head (here,
      // or on another instance as the store's news tells).
      const sleepMs = roomInMs + Math.random() * JITTER_MS;
      const onGone = request ? (listener: () => void) => request.onGone(listener) : neverGone;
      await queue.sleep(Math.max(0, Math.min(sleepMs, deadline - now)), onGone);
      const gaveUp = await queue.giveWay(ticket, deadline, performance.now(), onGone);
      if (gaveUp) {
        head.heading = false;
        return refusedUnasked(prepared, waiting, gaveUp);
      }
    }
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

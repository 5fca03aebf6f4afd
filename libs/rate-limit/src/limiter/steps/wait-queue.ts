import type { PreparedRule } from '../prepare-hits.js';

/** When a request out of time may try again, where nothing foretells room: a cap's retry time. */
export const OUT_OF_TIME_RETRY_MS = 1_000;

/** Why a waiter stopped waiting before its turn: it would wait too long, or its client went. */
export type GaveUp = { readonly roomInMs: number } | 'gone';

/** A request waiting behind the head of its key's queue. */
interface Waiter {
  /** Its place in arrival order (`WaitStep`'s count of requests). */
  readonly ticket: number;
  readonly deadline: number;
  /** Its turn to ask the store (undefined), or why it stops waiting. */
  readonly settle: (gaveUp: GaveUp | undefined) => void;
}

/** How room comes back to a waiting rule: after `roomAt`, `perBatch` requests every `everyMs`. */
export interface Pace {
  readonly roomAt: number;
  readonly everyMs: number;
  readonly perBatch: number;
}

/**
 * The requests of one key waiting in this instance, in arrival order: the head asks the store and
 * sleeps until room is due; the others wait for their turn without a store call. When the head
 * learns when room comes (`pace`), each waiter whose turn would come after its deadline is told at
 * once, and so is a request that arrives to such a place.
 */
export class WaitQueue {
  private readonly behind: Waiter[] = [];

  /** @param keys the keys of the waiting rules: room given back on any may admit the head. */
  constructor(readonly keys: readonly string[]) {}

  /** Whether a head is deciding (asking or sleeping). */
  private busy = false;
  private pace: Pace | undefined;
  private wakeHead: (() => void) | undefined;
  /** Room was given back while the head's call was out: its answer may predate it. */
  private releasedWhileAsking = false;

  /** Requests waiting: those behind the head, and the head itself. */
  get size(): number {
    return this.behind.length + (this.busy ? 1 : 0);
  }

  get idle(): boolean {
    return !this.busy && this.behind.length === 0;
  }

  /**
   * Resolves when it is this request's turn to ask (undefined: at once when no one is ahead), or
   * with why it stops waiting first.
   */
  turn(
    ticket: number,
    deadline: number,
    now: number,
    onGone: (listener: () => void) => () => void,
  ): Promise<GaveUp | undefined> {
    if (!this.busy) {
      this.busy = true;
      return Promise.resolve(undefined);
    }
    // In arrival order: requests that asked at once are answered in any order.
    let place = this.behind.length;
    while (place > 0 && this.behind[place - 1].ticket > ticket) place -= 1;
    const due = this.dueAt(place + 1);
    if (due !== undefined && due > deadline) return Promise.resolve({ roomInMs: due - now });
    let timer: NodeJS.Timeout | undefined;
    let stop: (() => void) | undefined;
    return new Promise((resolve) => {
      const waiter: Waiter = {
        ticket,
        deadline,
        settle: (gaveUp) => {
          clearTimeout(timer);
          stop?.();
          resolve(gaveUp);
        },
      };
      const leave = (gaveUp: GaveUp) => {
        this.remove(waiter);
        waiter.settle(gaveUp);
      };
      // Its own deadline: the head's answers foretell a rate's room, never a cap's.
      timer = setTimeout(() => leave({ roomInMs: OUT_OF_TIME_RETRY_MS }), Math.max(0, deadline - performance.now()));
      stop = onGone(() => leave('gone'));
      this.behind.splice(place, 0, waiter);
    });
  }

  /**
   * For the head about to ask again: a request that arrived before it and got in line after it
   * (their first answers came in another order) goes first; the head then waits for its turn again.
   * Undefined when the head is first in arrival order.
   */
  giveWay(
    ticket: number,
    deadline: number,
    now: number,
    onGone: (listener: () => void) => () => void,
  ): Promise<GaveUp | undefined> | undefined {
    if (!(this.behind.length > 0 && this.behind[0].ticket < ticket)) return undefined;
    const earlier = this.behind.shift()!;
    const turn = this.turn(ticket, deadline, now, onGone);
    earlier.settle(undefined);
    return turn;
  }

  /** The head learned when room comes: waiters who would get it after their deadline are told. */
  learned(pace: Pace | undefined, now: number): void {
    this.pace = pace;
    if (!pace) return;
    for (let i = this.behind.length - 1; i >= 0; i -= 1) {
      const due = this.dueAt(i + 1)!;
      const waiter = this.behind[i];
      if (due <= waiter.deadline) continue;
      this.behind.splice(i, 1);
      waiter.settle({ roomInMs: due - now });
    }
  }

  /** The head asks the store: a release from now on may not be in its answer. */
  asking(): void {
    this.releasedWhileAsking = false;
  }

  /** Sleeps the head until `ms` have passed, room is released here (`release`), or its client goes. */
  sleep(ms: number, onGone: (listener: () => void) => () => void): Promise<void> {
    if (this.releasedWhileAsking) {
      this.releasedWhileAsking = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        stop();
        this.wakeHead = undefined;
        resolve();
      };
      const timer = setTimeout(wake, ms);
      const stop = onGone(wake);
      this.wakeHead = wake;
    });
  }

  /**
   * Room was given back (a slot, a refund, here or as the store's news tells): the head asks again,
   * after `delayMs` (a jitter that spreads the instances' heads woken by one release).
   */
  release(delayMs = 0): void {
    const wake = this.wakeHead;
    if (!wake) {
      if (this.busy) this.releasedWhileAsking = true;
    } else if (delayMs <= 0) {
      wake();
    } else {
      // Unless it woke meanwhile (its sleep is then another).
      setTimeout(() => this.wakeHead === wake && wake(), delayMs);
    }
  }

  /** The head is done: the next waiter's turn, at once. */
  next(): void {
    const waiter = this.behind.shift();
    if (waiter) waiter.settle(undefined);
    else {
      this.busy = false;
      this.pace = undefined;
    }
  }

  /** When the waiter at `place` (1: right behind the head) can expect room; undefined: not known. */
  private dueAt(place: number): number | undefined {
    const { pace } = this;
    if (!pace) return undefined;
    // The head takes the first of the room at `roomAt`; `place` requests come before this one.
    return pace.roomAt + Math.floor(place / pace.perBatch) * pace.everyMs;
  }

  private remove(waiter: Waiter): void {
    const i = this.behind.indexOf(waiter);
    if (i >= 0) this.behind.splice(i, 1);
  }
}

/**
 * How room comes back for the rules a head waits on, from the store's refusal: undefined when the
 * store cannot tell (a cap, whose slots come back as requests end). The slowest rule sets it.
 */
export function paceOf(waiting: readonly PreparedRule[], roomInMs: number, now: number): Pace | undefined {
  if (waiting.some(({ hit }) => hit.slot)) return undefined;
  let everyMs = 0;
  let perBatch = Number.POSITIVE_INFINITY;
  for (const { hit } of waiting) {
    const perWindow = Math.max(1, Math.floor(hit.limit / Math.max(1, hit.cost)));
    // A bucket refills unit by unit; a window gives its whole limit back at once.
    const gradual = hit.algorithm === 'token-bucket' || hit.algorithm === 'gcra';
    const batch = gradual ? 1 : perWindow;
    const every = gradual ? hit.windowMs / perWindow : hit.windowMs;
    if (every / batch > everyMs / perBatch) {
      everyMs = every;
      perBatch = batch;
    }
  }
  return { roomAt: now + roomInMs, everyMs, perBatch };
}

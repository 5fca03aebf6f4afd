import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { WaitQueue } from './wait-queue.js';

/** A client that can go, and the listeners it holds. */
function client() {
  const listeners = new Set<() => void>();
  return {
    listeners,
    onGone: (listener: () => void) => {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    go: () => [...listeners].forEach((listener) => listener()),
  };
}

describe('WaitQueue', () => {
  beforeEach(() => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] });
  });
  afterEach(() => vi.useRealTimers());

  it('lets a waiter behind the head go at its own deadline, however long the head waits', async () => {
    const queue = new WaitQueue(['k']);
    const now = performance.now();
    expect(await queue.turn(1, now + 3_000, now, client().onGone)).toBeUndefined();
    const settled: unknown[] = [];
    const behind = client();
    void queue.turn(2, now + 300, now, behind.onGone).then((gaveUp) => settled.push(gaveUp));
    await vi.advanceTimersByTimeAsync(299);
    expect(settled).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(settled).toEqual([{ roomInMs: 1_000 }]);
    expect(queue.size).toBe(1);
    // It left: nothing of it stays on its client.
    expect(behind.listeners.size).toBe(0);
  });

  it('lets a waiter whose client goes leave at once, its listener removed', async () => {
    const queue = new WaitQueue(['k']);
    const now = performance.now();
    await queue.turn(1, now + 3_000, now, client().onGone);
    const behind = client();
    const turn = queue.turn(2, now + 3_000, now, behind.onGone);
    behind.go();
    expect(await turn).toBe('gone');
    expect(behind.listeners.size).toBe(0);
    expect(queue.size).toBe(1);
  });

  it('refuses at once the waiter whose room comes after its deadline, counting the head’s share', async () => {
    const queue = new WaitQueue(['k']);
    const now = performance.now();
    await queue.turn(1, now + 10_000, now, client().onGone);
    // Room for 2 at 1 s, 2 more at 2 s: the head takes one at 1 s.
    queue.learned({ roomAt: now + 1_000, everyMs: 1_000, perBatch: 2 }, now);
    const second = queue.turn(2, now + 1_500, now, client().onGone);
    const third = queue.turn(3, now + 1_500, now, client().onGone);
    expect(await third).toEqual({ roomInMs: 2_000 });
    queue.next();
    expect(await second).toBeUndefined();
  });
});

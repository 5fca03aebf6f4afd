import type { LoggerService } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { LOG_SAMPLING } from '../module/defaults.js';
import type { RateLimitCircuitBreakerOptions } from '../module/options.js';
import { CallDeadlines, type CircuitBreakerState, RedisCircuitBreaker, withDeadline } from './call-safety.js';
import { LateAnswers } from './late-answers.js';
import { mastersOf } from './masters.js';
import type { RedisScript } from './redis-script.js';
import { WriteBatches } from './write-batches.js';

/** The deadline of an operator's call (`runOperation`, `operation`). */
export const OPERATION_TIMEOUT_MS = 2_000;

/**
 * Runs the library's Lua scripts on one client: a request's call with the configured deadline,
 * through the circuit breaker, written with the rest of its turn's calls (`WriteBatches`); an
 * operator's call (a script, or a plain command: `operation`) with a deadline of its own, past the
 * breaker. Keeps every script it has met loaded on every master (`load`, on every (re)connect), so
 * EVALSHA normally hits. Tells how requests' calls have been going: the breaker's state, the calls
 * past their deadline (`LateAnswers`), whether Redis seems down.
 */
export class ScriptRunner {
  private readonly scripts = new Set<RedisScript>();
  private readonly deadlines: CallDeadlines;
  private readonly batches: WriteBatches;
  private readonly breaker: RedisCircuitBreaker | undefined;
  /** How calls past their deadline end (they tell the breaker how every call ended). */
  private readonly outcomes: LateAnswers;

  /** @param circuitBreaker the breaker's options; none: no breaker. */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly timeoutMs: number,
    circuitBreaker: Required<RateLimitCircuitBreakerOptions> | undefined,
    private readonly logger: LoggerService,
  ) {
    if (circuitBreaker) this.breaker = new RedisCircuitBreaker(circuitBreaker, logger, LOG_SAMPLING.intervalMs);
    this.outcomes = new LateAnswers(this.breaker);
    this.deadlines = new CallDeadlines(timeoutMs);
    this.batches = new WriteBatches(client, () => this.deadlines.sent());
  }

  /** Makes a script known, so it is loaded on every (re)connect (`run` does it for a script it meets first). */
  register(script: RedisScript): void {
    this.scripts.add(script);
    if (this.client.status === 'ready') void this.load([script]);
  }

  /**
   * A request's call: with the configured deadline, through the circuit breaker. A call past its
   * deadline rejects with `RedisTimeoutError`, which holds the call for its late answer
   * (`LateAnswers`); while the circuit is open, calls reject at once with `BrokenCircuitError`.
   */
  run(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    // A variant built on first use (`ScriptsByAlgorithms`) is loaded on reconnects from now on.
    if (!this.scripts.has(script)) this.register(script);
    const { breaker } = this;
    if (breaker && !breaker.closed) {
      return breaker.execute(() =>
        this.deadlines.track(script.run(this.client, keys, args), script.name, undefined, this.batches.hold()),
      );
    }
    const held = this.batches.hold();
    return this.deadlines.track(script.run(this.client, keys, args), script.name, this.outcomes, held);
  }

  /**
   * An operator's call (a limit written, a counter inspected), off the request path: with a
   * deadline of its own (2 s), not the requests', and past the circuit breaker, so an outage does
   * not hide whether Redis takes it.
   */
  runOperation(script: RedisScript, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    if (!this.scripts.has(script)) this.register(script);
    return withDeadline(script.run(this.client, keys, args), OPERATION_TIMEOUT_MS, script.name);
  }

  /**
   * An operator's plain command, made on the client (`(client) => client.hget(key, field)`), as
   * `runOperation` runs a script: with its deadline, or the one given, past the breaker; it never
   * hangs. On Cluster the client sends a command to the shard of its key (a MULTI's keys must
   * share a slot).
   * @param what the command, for the timeout's message
   */
  operation<T>(
    command: (client: Redis | Cluster) => Promise<T>,
    what: string,
    timeoutMs = OPERATION_TIMEOUT_MS,
  ): Promise<T> {
    return withDeadline(command(this.client), timeoutMs, what);
  }

  /** Whether every script met so far is cached on every master (SCRIPT EXISTS). */
  async loaded(): Promise<boolean> {
    const shas = [...this.scripts].map((script) => script.sha);
    if (shas.length === 0) return true;
    const answers = await Promise.all(
      mastersOf(this.client).map((node) =>
        withDeadline(node.script('EXISTS', ...shas) as Promise<number[]>, this.timeoutMs, 'SCRIPT EXISTS'),
      ),
    );
    return answers.every((exists) => exists.every((one) => one === 1));
  }

  /** Loads scripts on every master (all it knows by default). Never throws. */
  async load(scripts: Iterable<RedisScript> = this.scripts): Promise<void> {
    try {
      await Promise.all(
        mastersOf(this.client).flatMap((node) => [...scripts].map((script) => node.script('LOAD', script.source))),
      );
    } catch (error) {
      // EVALSHA falls back to EVAL on NOSCRIPT, so a failed preload only costs one extra round trip.
      this.logger.debug?.(`Preloading Lua scripts failed: ${String(error)}`);
    }
  }

  /** The circuit breaker's state: `'open'` while requests' calls to Redis are suspended. */
  get circuitState(): CircuitBreakerState {
    return this.breaker?.state ?? 'closed';
  }

  /**
   * Calls past their deadline, as judged (`LateAnswers`): `answered` late (a slow Redis), or
   * `unanswered` a second later (failures for the circuit breaker).
   */
  get lateCalls(): { answered: number; unanswered: number } {
    return { ...this.outcomes.counts };
  }

  /** Whether Redis seems down rather than slow (`LateAnswers.redisSeemsDown`): for the local fallback. */
  get seemsDown(): boolean {
    return this.outcomes.redisSeemsDown;
  }

  /** The app stops: writes the breaker's transitions not reported yet. */
  close(): void {
    this.breaker?.close();
  }
}

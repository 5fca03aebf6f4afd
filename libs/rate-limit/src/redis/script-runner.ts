import { createHash } from 'node:crypto';
import type { Writable } from 'node:stream';
import type { Cluster, Redis } from 'ioredis';
import { ALGORITHM_NAMES, type RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import type { LoggerService } from '@nestjs/common';
import { LOG_SAMPLING } from '../module/defaults.js';
import type { RateLimitCircuitBreakerOptions } from '../module/options.js';
import { CallDeadlines, type CallOutcomes, type CircuitBreakerState, RedisCircuitBreaker } from './call-safety.js';
import { LateAnswers } from './late-answers.js';
import { mastersOf } from './masters.js';
import { withDeadline } from './redis-timeout.js';

/** The deadline of an operator's call (`runOperation`, `operation`). */
export const OPERATION_TIMEOUT_MS = 2_000;

/**
 * Runs the library's Lua scripts on one client: a request's call with the configured deadline,
 * through the circuit breaker, written with the rest of its turn's calls (`WriteBatches`); an
 * operator's call (a script, or a plain command: `operation`) with a deadline of its own, past the
 * breaker. Keeps every script it has met loaded on every master (`load`, on every (re)connect), so
 * EVALSHA normally hits. Tells how requests' calls have been going: the breaker's state, the calls
 * past their deadline (`LateAnswers`), whether Redis seems down. Nothing else of the library runs
 * per command: the connection's parts (`redis-connection.ts`, `guarded-connector.ts`) act at connect.
 */
export class ScriptRunner {
  private readonly scripts = new Set<RedisScript>();
  private readonly deadlines: CallDeadlines;
  private readonly batches: WriteBatches;
  private readonly breaker: RedisCircuitBreaker | undefined;
  /** How calls past their deadline end (they tell the breaker how each ended, once judged). */
  private readonly late: LateAnswers;
  /**
   * How each request's call ended, told as it settles: an answer on time is a success for the
   * breaker, and says Redis is up again if it seemed down; a failure goes to `LateAnswers`.
   */
  private readonly ended: CallOutcomes = {
    succeeded: () => {
      // `down` is a plain field: a healthy Redis's answer reads one boolean here, and no more.
      if (this.late.down) this.late.answeredOnTime();
      this.breaker?.succeeded();
    },
    failed: (error) => this.late.failed(error),
  };

  /** @param circuitBreaker the breaker's options; none: no breaker. */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly timeoutMs: number,
    circuitBreaker: Required<RateLimitCircuitBreakerOptions> | undefined,
    private readonly logger: LoggerService,
  ) {
    if (circuitBreaker) this.breaker = new RedisCircuitBreaker(circuitBreaker, logger, LOG_SAMPLING.intervalMs);
    this.late = new LateAnswers(this.breaker);
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
    const { breaker, deadlines } = this;
    if (breaker && !breaker.closed) {
      return breaker.execute(() =>
        deadlines.track(script.run(this.client, keys, args), script.name, undefined, this.batches.hold(deadlines.idle)),
      );
    }
    const held = this.batches.hold(deadlines.idle);
    return deadlines.track(script.run(this.client, keys, args), script.name, this.ended, held);
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
    return { ...this.late.counts };
  }

  /** Whether Redis seems down rather than slow (`LateAnswers.redisSeemsDown`): for the local fallback. */
  get seemsDown(): boolean {
    return this.late.redisSeemsDown;
  }

  /** The app stops: writes the breaker's transitions not reported yet. */
  close(): void {
    this.breaker?.close();
  }
}

/**
 * A Lua script sent by SHA1 (EVALSHA), and re-sent whole (EVAL, which also caches it) when the
 * server answers NOSCRIPT: after `SCRIPT FLUSH`, a restart, or a failover to a node that never saw it.
 * Keys go only through KEYS, so Cluster routes the call to the keys' slot.
 */
export class RedisScript {
  readonly sha: string;

  constructor(
    readonly name: string,
    readonly source: string,
  ) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  run(client: Redis | Cluster, keys: readonly string[], args: readonly (string | number)[]): Promise<unknown> {
    return client.evalsha(this.sha, keys.length, ...keys, ...args).catch((error: unknown) => {
      if (!isNoScript(error)) throw error;
      return client.eval(this.source, keys.length, ...keys, ...args);
    });
  }
}

function isNoScript(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOSCRIPT');
}

/**
 * A script in variants by the algorithms its call uses, each built on first use and kept: Redis
 * runs a script's whole body on every call, so a call pays only for the algorithms it decides.
 * At most one variant per set of algorithms (31).
 */
export class ScriptsByAlgorithms {
  private readonly built = new Map<string, RedisScript>();

  constructor(
    private readonly name: string,
    private readonly source: (algorithms: ReadonlySet<RateLimitAlgorithmName>) => string,
  ) {}

  /** The variant for the algorithms of these hits. */
  for(hits: readonly { readonly algorithm: RateLimitAlgorithmName }[]): RedisScript {
    const id =
      hits.length === 1
        ? hits[0].algorithm
        : ALGORITHM_NAMES.filter((name) => hits.some((hit) => hit.algorithm === name)).join('+');
    let script = this.built.get(id);
    if (!script) {
      script = new RedisScript(this.name, this.source(new Set(hits.map((hit) => hit.algorithm))));
      this.built.set(id, script);
    }
    return script;
  }
}

/**
 * Commands in one write at most: Redis starts on them while the app makes the rest. A whole turn in
 * one write left Redis and the app idle in turn (0.6x the one-EVALSHA floor's decisions per second
 * at 16 in flight, 1.6x with 8); one per command paid a system call each. 8 was best of 4, 8, 16.
 */
const MAX_HELD = 8;

/**
 * Sends the commands made in one turn of the event loop to Redis a few writes at a time. ioredis
 * writes each command to its socket as it is made, and that system call, not the script, is most
 * of what a decision costs the app (and the read of each, most of what it costs Redis).
 *
 * The first command of a batch corks the connection's socket; the ninth, or else `setImmediate`
 * (which runs once the turn's I/O callbacks are done: the requests that arrived together, the
 * replies read together), uncorks it, and Node writes what it holds at once. A command waits for
 * nothing but the rest of its own turn, and its deadline starts when it goes out
 * (`CallDeadlines.sent`): a turn stalled by the app's own work before the write must not look like
 * a slow Redis. Commands of an application-supplied client made meanwhile go in the same write, in
 * their order. On Cluster the masters' sockets are corked together. A lone call (none in flight,
 * and the last batch held one) is not held: a caller that waits for each answer gained nothing from
 * the cork and paid for it (5 µs of a decision's CPU; releasing it after its microtasks saved none).
 */
export class WriteBatches {
  private corked: Writable[] | undefined;
  private held = 0;
  /** A release at the end of this turn is due (`setImmediate`). */
  private releaseDue = false;
  /** Commands held this turn, and in the last turn that held any. */
  private heldThisTurn = 0;
  private heldLastTurn = 1;

  /** @param sent told each time held commands have gone out. */
  constructor(
    private readonly client: Redis | Cluster,
    private readonly sent: () => void,
  ) {}

  /**
   * Call before a command is made: it goes out with the rest of this turn's. Returns whether it is
   * held (false for a lone call, and while not connected: it fails or goes at once).
   * @param idle no other call is in flight
   */
  hold(idle: boolean): boolean {
    if (idle && this.heldLastTurn === 1) return false;
    this.heldThisTurn += 1;
    if (this.corked) {
      if (this.held < MAX_HELD) {
        this.held += 1;
        return true;
      }
      // A full batch goes now, and this command starts the next. Now, not in a microtask: the calls
      // of one read of replies all come back in the same round of microtasks, so a release queued
      // behind them sent the whole turn as one batch after all.
      this.release();
    }
    const streams = socketsOf(this.client);
    if (streams.length === 0) return false;
    for (const stream of streams) stream.cork();
    this.corked = streams;
    this.held = 1;
    if (!this.releaseDue) {
      this.releaseDue = true;
      setImmediate(this.releaseAtTurnEnd);
    }
    return true;
  }

  private readonly releaseAtTurnEnd = (): void => {
    this.releaseDue = false;
    this.heldLastTurn = this.heldThisTurn;
    this.heldThisTurn = 0;
    this.release();
  };

  private release(): void {
    const streams = this.corked;
    if (!streams) return;
    this.corked = undefined;
    for (const stream of streams) stream.uncork();
    this.sent();
  }
}

/** The sockets commands are written to now: none while not connected. */
function socketsOf(client: Redis | Cluster): Writable[] {
  if (!client.isCluster) return client.status === 'ready' ? [(client as Redis).stream] : [];
  return (client as Cluster)
    .nodes('master')
    .filter((node) => node.status === 'ready')
    .map((node) => node.stream);
}

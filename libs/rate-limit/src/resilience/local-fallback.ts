import { LOCAL_FALLBACK_BOUND, SLOW_REDIS_BOUND } from '../module/defaults.js';
import type { RateLimitConsumption, RateLimitHit } from '../store/rate-limit-store.js';
import { fallbackReceipts } from './fallback-receipt.js';
import type { LastSeen, LastSeenKeys } from './last-seen.js';
import { BankedUnits } from './banked-units.js';
import { UnitsToRecord } from './pending-units.js';

export interface LocalFallbackOptions {
  /** How many instances share the store, as last counted (undefined: not known). */
  instances?: () => number | undefined;
  /**
   * Whether the store seems down rather than slow (calls past their deadline went unanswered lately):
   * then even failures that may have run in it take the whole share, not only the margin (below).
   */
  storeSeemsDown?: () => boolean;
  /** The instances assumed while they are not counted. Default 2. */
  expectedInstances: number;
  /** Keys remembered at most. */
  maxKeys: number;
  /** The shard of the store a key lives on (`RateLimitStore.shardOf`); default one for all. */
  shardOf?: (key: string) => string;
  /**
   * Units were banked for this key (`reconcile`): a refusal of Redis's that a layer above keeps
   * (the block cache) no longer holds on this instance, which may admit with them.
   */
  banked?: (key: string) => void;
}

/** A decision of the fallback; `recorded`: its units wait to be recorded in the store (`consume`). */
export interface LocalDecision extends RateLimitConsumption {
  readonly recorded: boolean;
}

/**
 * How long after its last local decision a window holds the share this instance took of it
 * (`holdsShares`): long enough for every instance to record what it admitted (each does at its
 * first answer) and for lost writes to be caught; short of an hour-long window after a blip.
 */
export const SHARE_HOLD_MS = 10_000;

/**
 * Decides while Redis cannot (the store-error policy `'local'`), so that all instances together
 * admit locally at most LOCAL_FALLBACK_BOUND (1.05) times the limit in any window while Redis is
 * out, and SLOW_REDIS_BOUND (1.2) while it is slow. Each instance remembers, per active key, what
 * Redis last reported, and takes its share of what is left: `(limit − last count) / instances`
 * rounded up, but no more than `(1.05 × limit − last count) / instances` rounded down, so that all
 * together admit at most `min(limit + instances − 1, 1.05 × limit)` (one instance: exactly the
 * limit), counted in the window Redis reported (a window it knows nothing of starts at the first
 * local decision, with nothing used). The instances are counted on Redis (`RedisNews.instances`);
 * until they are, `expectedInstances` are assumed. A request whose call may have reached Redis (it
 * missed its deadline) while Redis does not seem down shares only the margin above the limit,
 * `(1.2 − 1) × limit`: Redis may be slow, deciding on time for other instances and admitting the
 * limit there, so together they stay within 1.2x.
 *
 * A slow Redis still runs the calls that missed their deadline, and their late answers are
 * remembered (`LastSeenKeys.remember`), so the next stall in the same window starts from the true
 * count. What it admits without having reached Redis is recorded there once Redis answers again
 * (`UnitsToRecord`), for the units whose window is not over by then.
 */
export class LocalFallback {
  /** What the fallback admitted without reaching the store, to record there once it answers. */
  readonly pending: UnitsToRecord;
  /**
   * When the last window with a share held ends: past it, `shareRefusals` has nothing to check. A
   * field, read on every answer of the store before anything here is asked.
   */
  heldUntil = 0;
  private readonly banking: BankedUnits;

  /** @param lastSeen what Redis last said of each key, as the resilient store hears it on every answer */
  constructor(
    readonly lastSeen: LastSeenKeys,
    private readonly options: LocalFallbackOptions,
  ) {
    this.pending = new UnitsToRecord(options.maxKeys, (key) => this.shardOf(key));
    this.banking = new BankedUnits(lastSeen, this.pending, options.banked);
  }

  /** The shard a key lives on. */
  shardOf(key: string): string {
    return this.options.shardOf?.(key) ?? '';
  }

  /** Reset keys start afresh: what Redis last said of them no longer holds. */
  forget(keys: readonly string[]): void {
    for (const key of keys) {
      this.lastSeen.delete(key);
      this.pending.delete(key);
    }
  }

  /**
   * Decides a request locally, all rules or none, as the Redis store would.
   * @param unsent true when the failed call never reached Redis (circuit open, no connection): the
   *   admitted units are recorded later. A call that timed out may still run in Redis: its units
   *   are recorded only while Redis seems down, or once its late answer says Redis refused it
   *   (`reconcile`).
   * @param mayHaveRun the failure may have run in Redis (a call past its deadline, a connection
   *   dropped with calls written). Default: not `unsent`.
   * @param sentAt when the failed call went out (default `now`): what Redis said before then is
   *   behind by what the other instances admitted until then.
   */
  consume(
    hits: readonly RateLimitHit[],
    now: number,
    unsent: boolean,
    mayHaveRun = !unsent,
    sentAt = now,
  ): LocalDecision {
    const instances = Math.max(1, this.options.instances?.() ?? this.options.expectedInstances);
    const seemsDown = this.options.storeSeemsDown?.() ?? false;
    // A failure that may have run in Redis, while Redis does not seem down, says it may be slow and
    // deciding on time for other instances: they may have taken the whole limit since this one last
    // heard, so only the margin above it is shared. A lone instance heard every admission Redis
    // made (its calls on a key run in order: one still unanswered holds back those after it), so
    // what Redis last told it stands, as in an outage.
    const marginOnly = mayHaveRun && !seemsDown && instances > 1;
    // Recorded in Redis once it answers: what never reached it, and what a Redis that seems down
    // (a killed master, a partition) most likely never ran. Should it run after all (a paused
    // Redis resumed), the request counts twice: refusing a few too many, never admitting past
    // the limit unseen.
    const recorded = unsent || seemsDown;
    // Units Redis admitted late to requests refused here are the first taken: counted there already.
    const banked = this.takeBanked(hits, now);
    if (banked) return banked;
    const windows = hits.map((hit) => this.windowOf(hit, now));
    const shares = hits.map((hit, i) => {
      const window = windows[i];
      const { used } = window;
      if (marginOnly) {
        return Math.max(0, Math.floor((SLOW_REDIS_BOUND * hit.limit - Math.max(used, hit.limit)) / instances));
      }
      // The count this instance last heard is behind by what the others admitted since, until the
      // failed call went out: at the window's first local decision, taken as their part of the
      // key's rate over that time.
      if (window.others === undefined) {
        const since = Math.max(0, Math.min(now, sentAt) - window.at);
        window.others = instances > 1 ? Math.round((window.rate * since * (instances - 1)) / instances) : 0;
      }
      const estimated = Math.max(used, Math.min(hit.limit, used + window.others));
      // Each instance's part of what is left, rounded up, but never past the bound in all: at most
      // min(limit + instances − 1, 1.05 × limit).
      const part = Math.ceil((hit.limit - estimated) / instances);
      const share = Math.max(0, Math.min(part, Math.floor((LOCAL_FALLBACK_BOUND * hit.limit - estimated) / instances)));
      window.held = Math.min(window.held ?? share, share);
      window.heldUntil = Math.min(window.resetAt, now + SHARE_HOLD_MS);
      this.heldUntil = Math.max(this.heldUntil, window.heldUntil);
      return share;
    });
    const fits = hits.map((hit, i) => windows[i].blockedUntil <= now && windows[i].admitted + hit.cost <= shares[i]);
    const allowed = fits.every(Boolean);
    for (let i = 0; i < hits.length; i += 1) {
      const window = windows[i];
      if (allowed) {
        window.admitted += hits[i].cost;
        if (recorded) this.pending.add(hits[i], window.resetAt, now);
      } else if (!fits[i] && hits[i].blockMs > 0 && window.blockedUntil <= now) {
        // Refused here: its penalty starts, as Redis would start it (never in flight locally).
        window.blockedUntil = now + hits[i].blockMs;
      }
    }
    return this.decided(
      hits,
      windows,
      shares.map((share, i) => share - windows[i].admitted),
      allowed,
      recorded,
      now,
      fits,
    );
  }

  /** Whether units Redis admitted late to requests refused here wait for a request (`takeBanked`). */
  get hasBanked(): boolean {
    return this.lastSeen.banked.size > 0;
  }

  /**
   * An admission of units Redis admitted late to requests refused here (`BankedUnits`), if every
   * hit's window has enough of them.
   */
  takeBanked(hits: readonly RateLimitHit[], now: number): LocalDecision | undefined {
    const windows = this.banking.take(hits, now);
    return (
      windows &&
      this.decided(
        hits,
        windows,
        hits.map(() => 0),
        true,
        false,
        now,
      )
    );
  }

  /** The window of a key a local decision counts in: Redis's last reported, or one starting now. */
  private windowOf(hit: RateLimitHit, now: number): LastSeen {
    const seen = this.lastSeen.get(hit.key);
    if (seen && seen.resetAt > now) return seen;
    // A window Redis has not reported on: as far as this instance knows, it starts now. A penalty
    // started here outlasts the window, as in Redis.
    const guessed = {
      used: 0,
      limit: hit.limit,
      resetAt: now + hit.windowMs,
      admitted: 0,
      guessed: true,
      blockedUntil: seen?.blockedUntil ?? 0,
      banked: 0,
      at: now,
      since: now,
      sinceUsed: 0,
      rate: 0,
    };
    this.lastSeen.set(hit.key, guessed);
    return guessed;
  }

  /** A local decision as the store reports one; `left`, per hit, what its share has left. */
  private decided(
    hits: readonly RateLimitHit[],
    windows: readonly LastSeen[],
    left: readonly number[],
    allowed: boolean,
    recorded: boolean,
    now: number,
    fits?: readonly boolean[],
  ): LocalDecision {
    return {
      allowed,
      recorded,
      decisions: hits.map((hit, i) => {
        const window = windows[i];
        const blocked = window.blockedUntil > now;
        return {
          allowed: allowed || (fits?.[i] ?? false),
          limit: hit.limit,
          remaining: blocked ? 0 : Math.max(0, left[i]) + window.banked,
          resetMs: Math.max(window.resetAt, window.blockedUntil) - now,
        };
      }),
      // A `settleCost` admission's, so that its real cost is counted here too (`settled`).
      receipts: allowed
        ? fallbackReceipts(
            hits,
            windows.map((window) => window.resetAt),
            recorded,
            now,
          )
        : undefined,
    };
  }

  /** What Redis answered late to a request decided here (`BankedUnits.reconcile`). */
  reconcile(
    hits: readonly RateLimitHit[],
    late: RateLimitConsumption | undefined,
    admittedHere: boolean,
    now: number,
  ): void {
    this.banking.reconcile(hits, late, admittedHere, now);
  }

  /**
   * Whether a request Redis admitted still fits the shares this instance took of its windows while
   * Redis was out; if so, it is counted there (`shareRefusals`).
   */
  holdsShares(hits: readonly RateLimitHit[], now: number): boolean {
    return this.shareRefusals(hits, now) === undefined;
  }

  /**
   * Undefined when a request Redis admitted still fits the shares this instance took of its windows
   * while Redis was out, and is counted there; else, per hit, when the share that refuses it stops
   * holding (undefined for the hits that fit). A window the fallback decided stays within its
   * shares until it ends, or `SHARE_HOLD_MS` after the last local decision: once Redis answers
   * again, what it knows of that window is short of what the instances admitted meanwhile until
   * each has recorded its units, and of the writes a failover lost; deciding on it alone let a
   * client of a 10-unit rule through 1.3x on Cluster. Nothing to check (one comparison) unless a
   * window with a share held is still running.
   */
  shareRefusals(hits: readonly RateLimitHit[], now: number): (number | undefined)[] | undefined {
    if (now >= this.heldUntil) return undefined;
    const windows = hits.map((hit) => {
      const seen = this.lastSeen.get(hit.key);
      return seen?.held !== undefined && seen.resetAt > now && seen.heldUntil! > now ? seen : undefined;
    });
    const over = hits.map((hit, i) => windows[i] !== undefined && windows[i].admitted + hit.cost > windows[i].held!);
    if (over.some(Boolean)) {
      return windows.map((window, i) => (over[i] ? Math.min(window!.resetAt, window!.heldUntil!) : undefined));
    }
    hits.forEach((hit, i) => {
      if (windows[i]) windows[i].admitted += hit.cost;
    });
    return undefined;
  }
}

import { LRUCache } from 'lru-cache';
import { LOCAL_FALLBACK_BOUND, SLOW_REDIS_BOUND } from '../module/defaults.js';
import { type RateLimitConsumption, type RateLimitHit, committedUnits } from '../store/rate-limit-store.js';
import { type FallbackReceipt, fallbackReceipts } from './fallback-receipt.js';

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

/**
 * Units admitted here while the store was out, to record in it once it is back; `until` their
 * window is over (recording them after would only punish later requests); `shard`: where their key
 * lives.
 */
export type PendingUnits = { hit: RateLimitHit; until: number; shard: string };

/** A decision of the fallback; `recorded`: its units wait to be recorded in the store (`consume`). */
export interface LocalDecision extends RateLimitConsumption {
  readonly recorded: boolean;
}

/** Two reports of one window end agree within this much (they are computed from two clocks). */
const WINDOW_MATCH_MS = 50;

/**
 * How far apart two reports of one window's end may be. Each is read as the reply's `resetMs` from
 * when the app read it, so a busy event loop moves it later: the late answers Redis sends together
 * at a stall's end, read over 60 ms of a loaded loop, named one window by ends 60 ms apart, and the
 * units banked from the first were dropped as another window's. A fixed window's next one ends a
 * whole window after it at the soonest (a reset lets it start sooner, and is announced: `forget`),
 * so half a window tells them apart; the other algorithms' reset moves with every decision.
 */
function windowMatchMs(hit: RateLimitHit): number {
  return hit.algorithm === 'fixed-window' ? Math.max(WINDOW_MATCH_MS, hit.windowMs / 2) : WINDOW_MATCH_MS;
}

/**
 * How long after its last local decision a window holds the share this instance took of it
 * (`holdsShares`): long enough for every instance to record what it admitted (each does at its
 * first answer) and for lost writes to be caught; short of an hour-long window after a blip.
 */
export const SHARE_HOLD_MS = 10_000;

/** A key's rate is trusted once heard over this long: two replies a ms apart say nothing of it. */
const RATE_SPAN_MS = 100;

/**
 * What Redis last said about a key: units used, under which limit (a changed limit changes the
 * count, not a loss), and when its window resets (on this instance's clock, read after the reply:
 * a stalled event loop delays it by the stall); `resetAt` stays as first seen for the whole window,
 * which it names. `admitted`: units this instance admitted in that window. `guessed`: a window
 * Redis has not reported on, which the fallback started when it first decided the key.
 */
type LastSeen = {
  used: number;
  limit: number;
  resetAt: number;
  admitted: number;
  guessed: boolean;
  /** Until when a `blockFor` penalty started here refuses the key (0: none). */
  blockedUntil: number;
  /**
   * Units Redis admitted in this window, late, for requests this instance had already refused at
   * their deadline (`reconcile`): Redis counted them and no client had them, so a request decided
   * here may take them, within the limit whatever the others admitted.
   */
  banked: number;
  /** When this instance last heard of the window (its clock), and the first time, with the count then. */
  at: number;
  since: number;
  sinceUsed: number;
  /** Units per ms the key's count grew, all instances together, as this instance heard it (0: not known). */
  rate: number;
  /**
   * The share of this window this instance took while Redis was out: it holds, Redis answering
   * again or not, until `heldUntil` (`holdsShares`).
   */
  held?: number;
  heldUntil?: number;
  /** What the other instances admitted since this one last heard, estimated at the first local decision. */
  others?: number;
};

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
 * remembered here (`remember`), so the next stall in the same window starts from the true count.
 * What it admits without having reached Redis is recorded there once Redis answers again
 * (`takePending`), for the units whose window is not over by then.
 */
export class LocalFallback {
  private readonly lastSeen: LRUCache<string, LastSeen>;
  private readonly pending: LRUCache<string, PendingUnits>;
  /** Keys with units pending, per shard: a shard that answers records its own, at once. */
  private readonly pendingPerShard = new Map<string, number>();
  /** When the last window with a share held ends: past it, `holdsShares` has nothing to check. */
  private heldUntil = 0;
  /** Keys whose window has units banked (`reconcile`): none, and nothing is looked up per request. */
  private readonly bankedKeys = new Set<string>();

  constructor(private readonly options: LocalFallbackOptions) {
    this.lastSeen = new LRUCache({ max: options.maxKeys, dispose: (_, key) => this.bankedKeys.delete(key) });
    this.pending = new LRUCache({
      max: options.maxKeys,
      dispose: ({ shard }) => {
        const left = (this.pendingPerShard.get(shard) ?? 1) - 1;
        if (left > 0) this.pendingPerShard.set(shard, left);
        else this.pendingPerShard.delete(shard);
      },
    });
  }

  /** Whether units admitted here wait to be recorded in the store. */
  get hasPending(): boolean {
    return this.pendingPerShard.size > 0;
  }

  /** Whether units admitted here wait to be recorded in any of these shards of the store. */
  hasPendingIn(shards: ReadonlySet<string>): boolean {
    for (const shard of shards) if (this.pendingPerShard.has(shard)) return true;
    return false;
  }

  /** The units admitted here for keys of these shards whose window is not over, to record; forgets them. */
  takePending(now: number, shards?: ReadonlySet<string>): PendingUnits[] {
    const units: PendingUnits[] = [];
    // A copy: entries are deleted on the way.
    for (const [key, each] of Array.from(this.pending.entries())) {
      if (shards && !shards.has(each.shard)) continue;
      this.pending.delete(key);
      if (each.until > now) units.push(each);
    }
    return units;
  }

  /** Units taken to record that did not reach the store: recorded next time. */
  putBack(units: readonly PendingUnits[]): void {
    for (const each of units) this.addPending(each.hit, each.until, 0);
  }

  /** The shard a key lives on. */
  shardOf(key: string): string {
    return this.options.shardOf?.(key) ?? '';
  }

  /** Notes what Redis reported for each hit of a request, on time or late. */
  remember(hits: readonly RateLimitHit[], consumption: RateLimitConsumption, now: number): void {
    for (let i = 0; i < hits.length; i += 1) {
      const hit = hits[i];
      const resetAt = now + consumption.decisions[i].resetMs;
      const used = committedUnits(hit, consumption, i);
      const seen = this.lastSeen.get(hit.key);
      if (!seen) {
        this.lastSeen.set(hit.key, {
          used,
          limit: hit.limit,
          resetAt,
          admitted: 0,
          guessed: false,
          blockedUntil: 0,
          banked: 0,
          at: now,
          since: now,
          sinceUsed: used,
          rate: 0,
        });
        continue;
      }
      // In place: the entry is the key's, and `get` has made it the most recent.
      // A late answer of a window gone, or of one before the window known here: nothing to learn.
      // A window guessed here is replaced by Redis's own at its first report (below).
      const match = seen.guessed ? WINDOW_MATCH_MS : windowMatchMs(hit);
      if (resetAt <= now || (resetAt < seen.resetAt - match && !seen.guessed)) continue;
      if (Math.abs(resetAt - seen.resetAt) <= match) {
        // The same window: a fixed window's count never falls (late answers come out of order).
        const same = hit.algorithm === 'fixed-window' && seen.limit === hit.limit;
        seen.used = same ? Math.max(used, seen.used) : used;
        seen.limit = hit.limit;
        // Redis's report of a window guessed here names it from now on: the guess was only the
        // time of a local decision, and later reports, read late on a busy loop, drift from it.
        if (seen.guessed) {
          seen.resetAt = resetAt;
          seen.guessed = false;
        }
        if (now - seen.since >= RATE_SPAN_MS)
          seen.rate = Math.max(0, (seen.used - seen.sinceUsed) / (now - seen.since));
        seen.at = Math.max(seen.at, now);
        continue;
      }
      // Another window. What this instance admitted in a window it guessed stays counted when the
      // two overlap: Redis's may have started later (on a stalled Redis, when it ran the late calls),
      // and the requests admitted meanwhile are of the same moment to their clients.
      const carried = seen.guessed && seen.resetAt > resetAt - hit.windowMs;
      seen.admitted = carried ? seen.admitted : 0;
      if (!carried) seen.held = seen.others = undefined;
      seen.used = used;
      seen.limit = hit.limit;
      seen.resetAt = resetAt;
      seen.guessed = false;
      seen.banked = 0;
      this.bankedKeys.delete(hit.key);
      // The rate carries over: the traffic is the same.
      seen.at = seen.since = now;
      seen.sinceUsed = used;
    }
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
        if (recorded) this.addPending(hits[i], window.resetAt, now);
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
    return this.bankedKeys.size > 0;
  }

  /**
   * An admission of units Redis admitted late to requests refused here (`reconcile`), if every
   * hit's window has enough of them: counted in Redis already, whatever decided this request (the
   * fallback, or Redis refusing it on time for want of the very units it counted for those).
   */
  takeBanked(hits: readonly RateLimitHit[], now: number): LocalDecision | undefined {
    if (this.bankedKeys.size === 0) return undefined;
    const windows: LastSeen[] = [];
    for (const hit of hits) {
      const seen = this.lastSeen.get(hit.key);
      if (!seen || seen.resetAt <= now) {
        this.bankedKeys.delete(hit.key);
        return undefined;
      }
      if (seen.banked < hit.cost || seen.blockedUntil > now) return undefined;
      windows.push(seen);
    }
    hits.forEach((hit, i) => {
      windows[i].banked -= hit.cost;
      if (windows[i].banked === 0) this.bankedKeys.delete(hit.key);
    });
    return this.decided(
      hits,
      windows,
      hits.map(() => 0),
      true,
      false,
      now,
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

  /**
   * What Redis answered, late, to a request this instance decided at its deadline without recording
   * it (`consume`, `recorded` false), once `remember` has learned the counts from it: undefined if
   * the call was lost with its connection, unknown whether it ran. Each way the two decisions can
   * differ is settled so that what clients got is what Redis counts:
   * - Redis admitted what was refused here: its units are banked, for a later request decided here.
   * - Redis refused (or never ran) what was admitted here: those units are recorded in Redis.
   * - Both admitted: counted once, in Redis; the share here gets the units back.
   * Only in the window Redis counted it in, where that is the one this instance decides in.
   */
  reconcile(
    hits: readonly RateLimitHit[],
    late: RateLimitConsumption | undefined,
    admittedHere: boolean,
    now: number,
  ): void {
    hits.forEach((hit, i) => {
      const seen = this.lastSeen.get(hit.key);
      if (!seen || seen.resetAt <= now) return;
      if (late && Math.abs(now + late.decisions[i].resetMs - seen.resetAt) > windowMatchMs(hit)) return;
      if (!late?.allowed) {
        if (admittedHere) this.addPending(hit, seen.resetAt, now);
      } else if (admittedHere) seen.admitted = Math.max(0, seen.admitted - hit.cost);
      else {
        seen.banked += hit.cost;
        this.bankedKeys.add(hit.key);
        this.options.banked?.(hit.key);
      }
    });
  }

  /**
   * A `settleCost` admission decided here cost `units` more than it reserved (fewer, if negative):
   * counted in its window here, and with the units to record in the store. An overdraft is
   * recorded whatever became of the reservation (the store never heard of it); a refund comes off
   * only a reservation that waits to be recorded, while it waits (one recorded, or that may have
   * run in the store, stays counted: the safe side).
   */
  settled(hit: RateLimitHit, units: number, receipt: FallbackReceipt, now: number): void {
    const { windowEndsAt } = receipt;
    const seen = this.lastSeen.get(hit.key);
    if (seen && Math.abs(seen.resetAt - windowEndsAt) <= windowMatchMs(hit)) {
      seen.admitted = Math.max(0, seen.admitted + units);
    }
    if (windowEndsAt <= now || units === 0) return;
    if (units > 0) {
      this.addPending({ ...hit, cost: units }, windowEndsAt, now);
      return;
    }
    const pending = receipt.recorded ? this.pending.get(hit.key) : undefined;
    if (!pending || pending.until <= now) return;
    const left = pending.hit.cost + units;
    if (left > 0) pending.hit = { ...pending.hit, cost: left };
    else this.pending.delete(hit.key);
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

  /** Units admitted without reaching Redis, to record in the window they belong to (ending `until`). */
  private addPending(hit: RateLimitHit, until: number, now: number): void {
    const units = this.pending.get(hit.key);
    if (units && units.until > now) {
      units.hit = { ...units.hit, cost: units.hit.cost + hit.cost };
      units.until = Math.min(units.until, until);
      return;
    }
    const shard = this.shardOf(hit.key);
    // Replacing an entry disposes of it first, so the count stays one per key.
    this.pending.set(hit.key, { hit, until, shard });
    this.pendingPerShard.set(shard, (this.pendingPerShard.get(shard) ?? 0) + 1);
  }
}

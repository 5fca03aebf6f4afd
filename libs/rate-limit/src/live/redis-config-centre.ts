import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import type { ConfigService } from '@nestjs/config';
import { APP_CONFIG_SERVICE } from '../limiter/app-config.js';
import { LOG_SAMPLING, REJECTION_LOG_MAX_KEYS } from '../module/defaults.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { SampledLogger } from '../logging/sampled-logger.js';
import { RedisService } from '../redis/redis.service.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { HeldConfigKeys } from './held-config-keys.js';
import { HeldLimits } from './held-limits.js';
import { IdentityEntries } from './identity-entries.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { LiveLimitsHash, UNUSABLE, isWrongType } from './live-limits-hash.js';
import { LostControls } from './lost-controls.js';
import { NestConfigCentre } from '../limiter/nest-config-centre.js';
import type { RateLimitOverride } from '../limiter/rate-limit-config-centre.js';

/** What a health check asks of the live config. */
export interface LiveConfigState {
  /**
   * Subscribed to changes, and the keys read since: news of every write reaches this instance. False
   * while the hash cannot be read at all (a key of another type in its place).
   */
  inSync: boolean;
  /** Keys with values in force from Redis. */
  keys: number;
  /** Times the values were read again (at the start, after a gap, and every `liveConfig.refreshMs`). */
  reloads: number;
  /** Values refused as invalid since the start (the last good value of their key stayed). */
  refused: number;
  /** Bans, overrides and live limits this instance held that Redis had lost, and were written back. */
  lost: {
    /** Times this instance found Redis without controls it held, and wrote them back. */
    times: number;
    /** When it last did (ms since the epoch), or undefined. */
    lastAt: number | undefined;
    /** False while the last write-back failed: Redis lacks controls this instance holds. */
    writtenBack: boolean;
  };
}

/**
 * Thresholds in Redis, shared by every instance and changed while they run. Each instance holds
 * the values of the keys its rules read in memory (no Redis call per request), subscribes to the
 * announcements every write makes, and reads those keys again after each (re)subscription and every
 * `liveConfig.refreshMs`, so a change reaches every instance in milliseconds, and a missed
 * announcement within that interval. While Redis is away, the last values read stay in force. Over
 * `ConfigService`'s values, when `ConfigModule` is imported. This class keeps that in step: which
 * keys are held, when they are read, what the subscription says; the Redis commands are
 * `LiveLimitsHash`'s, and what becomes of each value read is `HeldLimits`'s.
 *
 * Values arrive as JSON objects of `count`, `window`, `algorithm` and `mode`, in the hash
 * `<keyPrefix>:config`, field `configKey`. Each is checked as bootstrap checks decorators, against
 * the rules of its key; an invalid one is refused with a sampled warning naming the key and the
 * value, and the key's last good values stay. Fields no rule of this app reads (other apps', or
 * anything else) are neither read nor held: what an instance holds and asks Redis for is bounded by
 * its rules, not by the hash. Write them with `RateLimitManagementService` or the
 * `nest-rate-limit-limits` CLI, which check them before they are written. Keep the hash across
 * Redis restarts (AOF or RDB persistence); a Redis that lost it (restarted empty, evicted) has the
 * values written back by the instances that hold them (`LostControls`), as do bans and overrides.
 */
@Injectable()
export class RedisConfigCentre extends LiveConfigCentre implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly hash: LiveLimitsHash;
  /** The config keys this instance holds and reads: its rules', and those asked for (`get`). */
  private readonly known: HeldConfigKeys;
  /** Values in force, by key, as last read. */
  private readonly limits: HeldLimits;
  private readonly refusals: SampledLogger;
  /** Writes back what Redis lost of the controls held here, and says so (`lostLog`). */
  private readonly lost: LostControls;
  private readonly lostLog: SampledLogger;
  private timer: NodeJS.Timeout | undefined;
  private subscribed = false;
  /** Counts confirmed subscriptions: a full read begun after the latest one leaves nothing missed. */
  private subscriptions = 0;
  private readSinceSubscribed = false;
  private reloads = 0;
  private reading: Promise<void> | undefined;
  private readAgain = false;

  /** @internal Nest creates it (`configCentre: RedisConfigCentre`). */
  constructor(
    private readonly redis: RedisService,
    private readonly registry: RateLimitRuleRegistry,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Optional() @Inject(APP_CONFIG_SERVICE) config?: ConfigService | null,
  ) {
    super(
      config ? new NestConfigCentre(config) : undefined,
      new IdentityEntries(options.keyPrefix, options.clock ?? Date.now, redis),
    );
    if (!redis.isConfigured) {
      throw new RateLimitConfigurationError(
        "RateLimitModule options: 'configCentre' RedisConfigCentre needs 'redis'; without Redis, use MemoryConfigCentre",
      );
    }
    this.hash = new LiveLimitsHash(redis, options.keyPrefix);
    this.known = new HeldConfigKeys(registry, options.allow?.configKey, this.logger);
    // Sampled as rejection lines are, and written whatever `logging` says: a refused limit is news.
    this.refusals = new SampledLogger(this.logger, {
      ...LOG_SAMPLING,
      level: 'warn',
      maxKeys: REJECTION_LOG_MAX_KEYS,
      summary: 'Refused values of other config keys',
    });
    this.limits = new HeldLimits(this.refusals, (configKey) => registry.withConfigKey(configKey));
    this.lostLog = new SampledLogger(this.logger, {
      ...LOG_SAMPLING,
      level: 'warn',
      maxKeys: 10,
      summary: 'Controls written back',
    });
    this.lost = new LostControls(redis, this.lostLog, options.clock ?? Date.now);
    this.identities.restoreWith(this.lost);
    // Read again whenever a connection comes back: the subscription's, or the one reads go over
    // (whichever is ready last makes the read that finds everything missed).
    redis.connection.whenReady(() => void this.readKnown().catch(() => undefined));
    redis.news.listen(this.hash.channel, {
      message: (configKey) => {
        if (this.identities.isNews(configKey)) void this.identities.hear(configKey).catch(() => undefined);
        else void this.readOne(configKey);
      },
      listening: (on) => {
        this.subscribed = on;
        this.readSinceSubscribed = false;
        if (on) this.subscriptions += 1;
        // After a gap, announcements may have been missed: read the keys held again.
        if (on) void this.readKnown().catch(() => undefined);
      },
      refused: (error) =>
        `Subscribing to ${this.hash.channel} failed (${String(error)}); limits written to Redis reach this instance every ${this.options.liveConfig.refreshMs} ms only`,
    });
  }

  async onApplicationBootstrap(): Promise<void> {
    // The first requests already see the limits in force; a Redis not reachable yet delays nothing
    // past the call deadline, and the periodic read catches up.
    await this.readKnown().catch(() => undefined);
    this.timer = setInterval(() => void this.readKnown().catch(() => undefined), this.options.liveConfig.refreshMs);
    this.timer.unref();
  }

  onApplicationShutdown(): void {
    clearInterval(this.timer);
    this.refusals.close();
    this.lostLog.close();
  }

  /** For health checks and metrics. */
  get state(): LiveConfigState {
    return {
      inSync: this.subscribed && this.readSinceSubscribed,
      keys: this.limits.size,
      reloads: this.reloads,
      refused: this.limits.refused,
      lost: this.lost.state,
    };
  }

  protected current(configKey: string): RateLimitOverride | undefined {
    const values = this.limits.get(configKey);
    // A key first asked for is held from now on, read at once.
    if (values === undefined && !this.known.has(configKey) && this.known.ask(configKey)) void this.readOne(configKey);
    return values;
  }

  /**
   * Reads these keys from Redis. The values of keys this instance holds are taken in (and what it
   * holds returned: an invalid value there leaves the last good one); the others are checked and
   * returned, not held.
   */
  async read(configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    const keys = [...new Set(configKeys)];
    const found = new Map<string, RateLimitOverride>();
    if (keys.length === 0) return found;
    const texts = await this.hash.texts(keys, UNUSABLE);
    keys.forEach((configKey, i) => {
      const text = texts[i];
      let values: RateLimitOverride | undefined;
      if (this.known.has(configKey)) {
        this.limits.arrive(configKey, text);
        values = this.limits.get(configKey);
      } else if (text !== null) values = this.limits.checked(configKey, text).values;
      if (values) found.set(configKey, values);
    });
    return found;
  }

  writtenKeys(max: number): Promise<string[]> {
    return this.hash.fields(max);
  }

  held(): Map<string, RateLimitOverride> {
    return this.limits.copy();
  }

  /**
   * Writes a key's values and announces them; resolves once a replica has them where there are
   * replicas (see `Replicas.toConfirm`): a write a failover could still lose is
   * reported as failed, to be checked and made again.
   */
  async write(configKey: string, values: RateLimitOverride): Promise<void> {
    const text = JSON.stringify(values);
    const before = this.limits.textOf(configKey);
    await this.hash.put(configKey, text);
    // At once here, unless a newer write arrived meanwhile (its announcement then says it all).
    if (this.known.has(configKey) && this.limits.textOf(configKey) === before) this.limits.arrive(configKey, text);
  }

  async remove(configKey: string): Promise<boolean> {
    const before = this.limits.textOf(configKey);
    const reply = await this.hash.put(configKey, '');
    if (this.known.has(configKey) && this.limits.textOf(configKey) === before) this.limits.arrive(configKey, null);
    return reply === 1;
  }

  /**
   * Reads the keys this instance holds from Redis. One read at a time: one asked for while another
   * runs (a subscription confirmed meanwhile, say) makes it read once more when it ends, since the
   * running one may have missed what came before the subscription.
   */
  private async readKnown(): Promise<void> {
    if (this.reading) this.readAgain = true;
    this.reading ??= this.readUntilCurrent().finally(() => (this.reading = undefined));
    await this.reading;
  }

  private async readUntilCurrent(): Promise<void> {
    do {
      this.readAgain = false;
      await this.readHeldKeys();
    } while (this.readAgain);
  }

  private async readHeldKeys(): Promise<void> {
    const subscription = this.subscribed ? this.subscriptions : -1;
    // Bans and overrides with the limits: at the start, after a gap, and every refreshMs.
    const identities = this.identities.reload();
    identities.catch(() => undefined); // awaited below, unless the limits' read fails first
    const keys = this.known.all();
    let texts: (string | null)[];
    try {
      // The keys held, never the whole hash: the cost is the rules', whatever else it holds.
      texts = await this.hash.texts(keys, 'no limit can be read there, and the values last read stay in force');
    } catch (error) {
      if (error instanceof RateLimitConfigurationError) {
        // Not a moment's failure, which the next read may mend: no read can succeed, and what Redis
        // holds and what this instance serves part ways until the key is a hash again.
        this.readSinceSubscribed = false;
        this.refusals.record(this.hash.key, error.message);
      }
      throw error;
    }
    // Values held here that Redis lacks: lost (restarted empty, evicted), or deleted with the news
    // missed. Written back unless deleted (failing, the values held stay), then read again.
    const lacking = keys.flatMap((configKey, i) => {
      const held = texts[i] === null ? this.limits.textOf(configKey) : undefined;
      return held === undefined ? [] : [[configKey, held] as [string, string]];
    });
    if (lacking.length > 0) {
      await this.lost.restoreLimits(this.hash.key, this.hash.channel, lacking);
      texts = await this.hash.texts(keys, UNUSABLE);
    }
    keys.forEach((configKey, i) => this.limits.arrive(configKey, texts[i]));
    await identities;
    this.reloads += 1;
    if (this.subscribed && subscription === this.subscriptions) this.readSinceSubscribed = true;
  }

  private async readOne(configKey: string): Promise<void> {
    // News of a key no rule here reads (another app's) is not this instance's to hold.
    if (!this.known.has(configKey)) return;
    try {
      this.limits.arrive(configKey, await this.hash.text(configKey));
    } catch (error) {
      // Kept as it was; the next full read (every `liveConfig.refreshMs`) catches up, and tells
      // whether the hash can be read at all.
      if (isWrongType(error)) this.readSinceSubscribed = false;
    }
  }
}

import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import { RATE_LIMIT_DEFAULTS, REJECTION_LOG_MAX_KEYS } from '../module/defaults.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from '../module/options.js';
import { SampledLogger } from '../logging/sampled-logger.js';
import { RedisScript } from '../redis/redis-script.js';
import { RedisService } from '../redis/redis.service.js';
import { liveConfigKeys } from '../store/key-layout.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { checkLimitValues } from './check-limit-values.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { NestConfigCentre } from './nest-config-centre.js';
import type { RateLimitOverride } from './rate-limit-config-centre.js';

/** How long an operator's write waits for a replica to have it. */
const REPLICA_CONFIRM_MS = 1_000;

/**
 * Writes a key's values (or deletes them, given none) and announces the key, in one atomic call.
 * Replies with the number of values deleted (0 when there were none), or 1 for a write.
 */
const WRITE_SCRIPT = new RedisScript(
  'config-write',
  `
local changed = 1
if ARGV[2] == '' then changed = redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return changed
`,
);

/** What a health check asks of the live config. */
export interface LiveConfigState {
  /** Subscribed to changes, and every value read since: news of every write reaches this instance. */
  inSync: boolean;
  /** Keys with values in force from Redis. */
  keys: number;
  /** Times the values were read again in full (at the start, after a gap, and every `liveConfig.refreshMs`). */
  reloads: number;
  /** Values refused as invalid since the start (the last good value of their key stayed). */
  refused: number;
}

/**
 * Thresholds in Redis, shared by every instance and changed while they run. Each instance holds
 * them in memory (no Redis call per request), subscribes to the announcements every write makes, and
 * reads every value again after each (re)subscription and every `liveConfig.refreshMs`, so a change
 * reaches every instance in milliseconds, and a missed announcement within that interval. While
 * Redis is away, the last values read stay in force. Over `ConfigService`'s values, when
 * `ConfigModule` is imported.
 *
 * Values arrive as JSON objects of `count`, `window`, `algorithm` and `mode`, in the hash
 * `<keyPrefix>:config`, field `configKey`. Each is checked as bootstrap checks decorators, against
 * the rules of its key; an invalid one is refused with a sampled warning naming the key and the
 * value, and the key's last good values stay. Write them with `RateLimitManagementService` or the
 * `nest-rate-limit-limits` CLI, which check them before they are written. Keep the hash across
 * Redis restarts (AOF or RDB persistence): a Redis that comes back empty has no limits to serve.
 */
@Injectable()
export class RedisConfigCentre extends LiveConfigCentre implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly keys: { hash: string; channel: string };
  /** Values in force, by key: each a frozen object, replaced when its key's value changes. */
  private readonly values = new Map<string, RateLimitOverride>();
  /** The text last read per key, good or refused: unchanged text is not checked again. */
  private readonly texts = new Map<string, string>();
  private readonly refusals: SampledLogger;
  private timer: NodeJS.Timeout | undefined;
  private subscribed = false;
  /** Counts confirmed subscriptions: a full read begun after the latest one leaves nothing missed. */
  private subscriptions = 0;
  private readSinceSubscribed = false;
  private stats = { reloads: 0, refused: 0 };
  private reading: Promise<void> | undefined;
  private readAgain = false;

  /** @internal Nest creates it (`configCentre: RedisConfigCentre`). */
  constructor(
    private readonly redis: RedisService,
    private readonly registry: RateLimitRuleRegistry,
    @Inject(RESOLVED_RATE_LIMIT_OPTIONS) private readonly options: ResolvedRateLimitOptions,
    @Optional() config?: ConfigService,
  ) {
    super(config ? new NestConfigCentre(config) : undefined);
    if (!redis.isConfigured) {
      throw new RateLimitConfigurationError(
        "RateLimitModule options: 'configCentre' RedisConfigCentre needs 'redis'; without Redis, use MemoryConfigCentre",
      );
    }
    this.keys = liveConfigKeys(options.keyPrefix);
    // Sampled as rejection lines are, and written whatever `logging` says: a refused limit is news.
    const { intervalMs, maxLinesPerSecond } = options.logging || RATE_LIMIT_DEFAULTS.logging;
    this.refusals = new SampledLogger(this.logger, {
      intervalMs,
      maxLinesPerSecond,
      level: 'warn',
      maxKeys: REJECTION_LOG_MAX_KEYS,
      summary: 'Refused values of other config keys',
    });
    // Read again whenever a connection comes back: the subscription's, or the one reads go over
    // (whichever is ready last makes the read that finds everything missed).
    redis.whenReady(() => void this.readAll().catch(() => undefined));
    redis.listen(this.keys.channel, {
      message: (configKey) => void this.readOne(configKey),
      listening: (on) => {
        this.subscribed = on;
        this.readSinceSubscribed = false;
        if (on) this.subscriptions += 1;
        // After a gap, announcements may have been missed: read everything again.
        if (on) void this.readAll().catch(() => undefined);
      },
      refused: (error) =>
        `Subscribing to ${this.keys.channel} failed (${String(error)}); limits written to Redis reach this instance every ${this.options.liveConfig.refreshMs} ms only`,
    });
  }

  async onApplicationBootstrap(): Promise<void> {
    // The first requests already see the limits in force; a Redis not reachable yet delays nothing
    // past the call deadline, and the periodic read catches up.
    await this.readAll().catch(() => undefined);
    this.timer = setInterval(() => void this.readAll().catch(() => undefined), this.options.liveConfig.refreshMs);
    this.timer.unref();
  }

  onApplicationShutdown(): void {
    clearInterval(this.timer);
    this.refusals.close();
  }

  /** For health checks and metrics. */
  get state(): LiveConfigState {
    return {
      inSync: this.subscribed && this.readSinceSubscribed,
      keys: this.values.size,
      reloads: this.stats.reloads,
      refused: this.stats.refused,
    };
  }

  protected current(configKey: string): RateLimitOverride | undefined {
    return this.values.get(configKey);
  }

  /**
   * Reads every value from Redis. One read at a time: one asked for while another runs (a
   * subscription confirmed meanwhile, say) makes it read once more when it ends, since the
   * running one may have missed what came before the subscription.
   */
  async readAll(): Promise<Map<string, RateLimitOverride>> {
    if (this.reading) this.readAgain = true;
    this.reading ??= this.readUntilCurrent().finally(() => (this.reading = undefined));
    await this.reading;
    return new Map(this.values);
  }

  private async readUntilCurrent(): Promise<void> {
    do {
      this.readAgain = false;
      await this.readEverything();
    } while (this.readAgain);
  }

  held(): Map<string, RateLimitOverride> {
    return new Map(this.values);
  }

  /**
   * Writes a key's values and announces them; resolves once a replica has them where there are
   * replicas (see `RedisService.replicasToConfirm`): a write a failover could still lose is
   * reported as failed, to be checked and made again.
   */
  async write(configKey: string, values: RateLimitOverride): Promise<void> {
    const text = JSON.stringify(values);
    const before = this.texts.get(configKey);
    await this.redis.runOperation(WRITE_SCRIPT, [this.keys.hash], [configKey, text, this.keys.channel]);
    await this.confirmReplicated(configKey);
    // At once here, unless a newer write arrived meanwhile (its announcement then says it all).
    if (this.texts.get(configKey) === before) this.arrive(configKey, text);
  }

  async remove(configKey: string): Promise<boolean> {
    const before = this.texts.get(configKey);
    const deleted = await this.redis.runOperation(WRITE_SCRIPT, [this.keys.hash], [configKey, '', this.keys.channel]);
    await this.confirmReplicated(configKey);
    if (this.texts.get(configKey) === before) this.arrive(configKey, null);
    return deleted === 1;
  }

  private async confirmReplicated(configKey: string): Promise<void> {
    const replicas = await this.redis.replicasToConfirm();
    if (replicas === 0) return;
    if ((await this.redis.waitForReplicas(replicas, REPLICA_CONFIRM_MS)) >= replicas) return;
    throw new Error(
      `The limits of '${configKey}' were written, but no replica confirmed them within ${REPLICA_CONFIRM_MS} ms (a failover under way?): a failover could still lose them; check them with get, and write them again`,
    );
  }

  private async readEverything(): Promise<void> {
    const subscription = this.subscribed ? this.subscriptions : -1;
    const stored = await this.redis.operation(this.redis.client.hgetall(this.keys.hash), 'HGETALL');
    for (const configKey of this.texts.keys()) if (!(configKey in stored)) this.arrive(configKey, null);
    for (const [configKey, text] of Object.entries(stored)) this.arrive(configKey, text);
    this.stats.reloads += 1;
    if (this.subscribed && subscription === this.subscriptions) this.readSinceSubscribed = true;
  }

  private async readOne(configKey: string): Promise<void> {
    try {
      this.arrive(configKey, await this.redis.operation(this.redis.client.hget(this.keys.hash, configKey), 'HGET'));
    } catch {
      // Kept as it was; the next full read (every `liveConfig.refreshMs`) catches up.
    }
  }

  /** A key's text as read from Redis (null: none): checked, and in force if good. */
  private arrive(configKey: string, text: string | null): void {
    if (text === null) {
      this.texts.delete(configKey);
      this.values.delete(configKey);
      return;
    }
    if (this.texts.get(configKey) === text) return;
    this.texts.set(configKey, text);
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
    const problems = checkLimitValues(configKey, parsed, this.registry.withConfigKey(configKey));
    if (problems.length > 0) {
      this.stats.refused += 1;
      const kept = this.values.get(configKey);
      this.refusals.record(
        configKey,
        `Refused limits ${text.length > 200 ? `${text.slice(0, 200)}…` : text} for config key '${configKey}' (${problems.join('; ')}); ${kept ? `its last good values ${JSON.stringify(kept)} stay` : "its rules' decorator values stay"}`,
      );
      return;
    }
    this.values.set(configKey, Object.freeze({ ...(parsed as RateLimitOverride) }));
  }
}

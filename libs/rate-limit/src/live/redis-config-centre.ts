import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  Optional,
} from '@nestjs/common';
import type { ConfigService } from '@nestjs/config';
import { APP_CONFIG_SERVICE } from './app-config.js';
import { LOG_SAMPLING, REJECTION_LOG_MAX_KEYS } from '../module/defaults.js';
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
import type { RateLimitOverride } from '../limiter/rate-limit-config-centre.js';

/** How long an operator's write waits for a replica to have it. */
const REPLICA_CONFIRM_MS = 1_000;

/**
 * Config keys held beyond those of the app's rules: keys first asked for by `get` (rules given to
 * `RateLimiterService.consume` as options). Code declares them, so they are few; the bound keeps a
 * caller that makes keys of its input from growing what every re-read asks Redis for.
 */
const MAX_ASKED_KEYS = 1_000;

/** What a call that met a hash of live limits of another type did. */
const UNUSABLE = 'nothing was read or written';

/** Fields one HSCAN call looks at when keys are listed (`writtenKeys`). */
const SCAN_COUNT = 100;

/**
 * Writes a key's values (or deletes them, given none) and announces the key, in one atomic call.
 * Replies with the number of values deleted (0 when there were none), or 1 for a write; or, when
 * the key holds something other than a hash, with that type's name, writing and announcing nothing.
 */
const WRITE_SCRIPT = new RedisScript(
  'config-write',
  `
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then return kind end
local changed = 1
if ARGV[2] == '' then changed = redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return changed
`,
);

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
}

/**
 * Thresholds in Redis, shared by every instance and changed while they run. Each instance holds
 * the values of the keys its rules read in memory (no Redis call per request), subscribes to the
 * announcements every write makes, and reads those keys again after each (re)subscription and every
 * `liveConfig.refreshMs`, so a change reaches every instance in milliseconds, and a missed
 * announcement within that interval. While Redis is away, the last values read stay in force. Over
 * `ConfigService`'s values, when `ConfigModule` is imported.
 *
 * Values arrive as JSON objects of `count`, `window`, `algorithm` and `mode`, in the hash
 * `<keyPrefix>:config`, field `configKey`. Each is checked as bootstrap checks decorators, against
 * the rules of its key; an invalid one is refused with a sampled warning naming the key and the
 * value, and the key's last good values stay. Fields no rule of this app reads (other apps', or
 * anything else) are neither read nor held: what an instance holds and asks Redis for is bounded by
 * its rules, not by the hash. Write them with `RateLimitManagementService` or the
 * `nest-rate-limit-limits` CLI, which check them before they are written. Keep the hash across
 * Redis restarts (AOF or RDB persistence): a Redis that comes back empty has no limits to serve.
 */
@Injectable()
export class RedisConfigCentre extends LiveConfigCentre implements OnApplicationBootstrap, OnApplicationShutdown {
  private readonly logger = new Logger('RateLimit');
  private readonly keys: { hash: string; channel: string };
  /** The config keys this instance holds and reads: its rules', and those asked for (`get`). */
  private readonly known = new Set<string>();
  private asked = 0;
  private saidTooManyAsked = false;
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
    @Optional() @Inject(APP_CONFIG_SERVICE) config?: ConfigService | null,
  ) {
    super(config ? new NestConfigCentre(config) : undefined);
    if (!redis.isConfigured) {
      throw new RateLimitConfigurationError(
        "RateLimitModule options: 'configCentre' RedisConfigCentre needs 'redis'; without Redis, use MemoryConfigCentre",
      );
    }
    this.keys = liveConfigKeys(options.keyPrefix);
    // Sampled as rejection lines are, and written whatever `logging` says: a refused limit is news.
    this.refusals = new SampledLogger(this.logger, {
      ...LOG_SAMPLING,
      level: 'warn',
      maxKeys: REJECTION_LOG_MAX_KEYS,
      summary: 'Refused values of other config keys',
    });
    // Read again whenever a connection comes back: the subscription's, or the one reads go over
    // (whichever is ready last makes the read that finds everything missed).
    redis.whenReady(() => void this.readKnown().catch(() => undefined));
    redis.listen(this.keys.channel, {
      message: (configKey) => void this.readOne(configKey),
      listening: (on) => {
        this.subscribed = on;
        this.readSinceSubscribed = false;
        if (on) this.subscriptions += 1;
        // After a gap, announcements may have been missed: read the keys held again.
        if (on) void this.readKnown().catch(() => undefined);
      },
      refused: (error) =>
        `Subscribing to ${this.keys.channel} failed (${String(error)}); limits written to Redis reach this instance every ${this.options.liveConfig.refreshMs} ms only`,
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
    const values = this.values.get(configKey);
    if (values === undefined && !this.known.has(configKey)) this.learn(configKey);
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
    let texts: (string | null)[];
    try {
      texts = await this.redis.operation(this.redis.client.hmget(this.keys.hash, ...keys), 'HMGET');
    } catch (error) {
      throw await this.explained(error, UNUSABLE);
    }
    keys.forEach((configKey, i) => {
      const text = texts[i];
      let values: RateLimitOverride | undefined;
      if (this.known.has(configKey)) {
        this.arrive(configKey, text);
        values = this.values.get(configKey);
      } else if (text !== null) values = this.checked(configKey, text).values;
      if (values) found.set(configKey, values);
    });
    return found;
  }

  async writtenKeys(max: number): Promise<string[]> {
    const found = new Set<string>();
    let cursor = '0';
    // A few calls of SCAN_COUNT fields each, whatever the hash holds.
    for (let calls = 0; calls <= Math.ceil(max / SCAN_COUNT) && found.size < max; calls += 1) {
      let fields: string[];
      try {
        [cursor, fields] = await this.redis.operation(
          this.redis.client.hscan(this.keys.hash, cursor, 'COUNT', SCAN_COUNT),
          'HSCAN',
        );
      } catch (error) {
        throw await this.explained(error, UNUSABLE);
      }
      for (let i = 0; i < fields.length && found.size < max; i += 2) found.add(fields[i]);
      if (cursor === '0') break;
    }
    return [...found];
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
    const reply = await this.redis.runOperation(WRITE_SCRIPT, [this.keys.hash], [configKey, text, this.keys.channel]);
    if (typeof reply === 'string') throw this.wrongType(reply, UNUSABLE);
    await this.confirmReplicated(configKey);
    // At once here, unless a newer write arrived meanwhile (its announcement then says it all).
    if (this.known.has(configKey) && this.texts.get(configKey) === before) this.arrive(configKey, text);
  }

  async remove(configKey: string): Promise<boolean> {
    const before = this.texts.get(configKey);
    const reply = await this.redis.runOperation(WRITE_SCRIPT, [this.keys.hash], [configKey, '', this.keys.channel]);
    if (typeof reply === 'string') throw this.wrongType(reply, UNUSABLE);
    await this.confirmReplicated(configKey);
    if (this.known.has(configKey) && this.texts.get(configKey) === before) this.arrive(configKey, null);
    return reply === 1;
  }

  private async confirmReplicated(configKey: string): Promise<void> {
    const replicas = await this.redis.replicasToConfirm();
    if (replicas === 0) return;
    if ((await this.redis.waitForReplicas(replicas, REPLICA_CONFIRM_MS)) >= replicas) return;
    throw new Error(
      `The limits of '${configKey}' were written, but no replica confirmed them within ${REPLICA_CONFIRM_MS} ms (a failover under way?): a failover could still lose them; check them with get, and write them again`,
    );
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
    // The rules' keys: the registry has them from the modules' init, before Redis is first ready.
    for (const rule of this.registry.all()) if (rule.configKey !== undefined) this.known.add(rule.configKey);
    const keys = [...this.known];
    let texts: (string | null)[];
    try {
      // HMGET of the keys held, never the whole hash: the cost is the rules', whatever else it
      // holds. With no key to read, HLEN still tells whether the hash can be read at all.
      texts =
        keys.length > 0
          ? await this.redis.operation(this.redis.client.hmget(this.keys.hash, ...keys), 'HMGET')
          : (await this.redis.operation(this.redis.client.hlen(this.keys.hash), 'HLEN'), []);
    } catch (error) {
      const explained = await this.explained(
        error,
        'no limit can be read there, and the values last read stay in force',
      );
      if (explained instanceof RateLimitConfigurationError) {
        // Not a moment's failure, which the next read may mend: no read can succeed, and what Redis
        // holds and what this instance serves part ways until the key is a hash again.
        this.readSinceSubscribed = false;
        this.refusals.record(this.keys.hash, explained.message);
      }
      throw explained;
    }
    keys.forEach((configKey, i) => this.arrive(configKey, texts[i]));
    this.stats.reloads += 1;
    if (this.subscribed && subscription === this.subscriptions) this.readSinceSubscribed = true;
  }

  private async readOne(configKey: string): Promise<void> {
    // News of a key no rule here reads (another app's) is not this instance's to hold.
    if (!this.known.has(configKey)) return;
    try {
      this.arrive(configKey, await this.redis.operation(this.redis.client.hget(this.keys.hash, configKey), 'HGET'));
    } catch (error) {
      // Kept as it was; the next full read (every `liveConfig.refreshMs`) catches up, and tells
      // whether the hash can be read at all.
      if (isWrongType(error)) this.readSinceSubscribed = false;
    }
  }

  /** Holds a key first asked for by `get` from now on, read at once. */
  private learn(configKey: string): void {
    if (this.asked >= MAX_ASKED_KEYS) {
      if (!this.saidTooManyAsked) {
        this.saidTooManyAsked = true;
        this.logger.warn(
          `More than ${MAX_ASKED_KEYS} config keys asked for beyond the rules'; '${configKey}' and later ones keep their rules' values (are config keys made of input?)`,
        );
      }
      return;
    }
    this.asked += 1;
    this.known.add(configKey);
    void this.readOne(configKey);
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
    const { values, problems } = this.checked(configKey, text);
    if (!values) {
      this.stats.refused += 1;
      const kept = this.values.get(configKey);
      this.refusals.record(
        configKey,
        `Refused limits ${text.length > 200 ? `${text.slice(0, 200)}…` : text} for config key '${configKey}' (${problems.join('; ')}); ${kept ? `its last good values ${JSON.stringify(kept)} stay` : "its rules' decorator values stay"}`,
      );
      return;
    }
    this.values.set(configKey, values);
  }

  /** A key's text as values, checked with the rules of the key this app has (frozen), or the problems found. */
  private checked(configKey: string, text: string): { values?: RateLimitOverride; problems: string[] } {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      parsed = text;
    }
    const problems = checkLimitValues(configKey, parsed, this.registry.withConfigKey(configKey));
    if (problems.length > 0) return { problems };
    return { values: Object.freeze({ ...(parsed as RateLimitOverride) }), problems };
  }

  /** `error`, or when it is Redis's WRONGTYPE, the error that names the key and what it holds. */
  private async explained(error: unknown, consequence: string): Promise<unknown> {
    if (!isWrongType(error)) return error;
    const type = await this.redis
      .operation(this.redis.client.type(this.keys.hash), 'TYPE')
      .catch(() => 'value of another type');
    return this.wrongType(type, consequence);
  }

  private wrongType(type: string, consequence: string): RateLimitConfigurationError {
    return new RateLimitConfigurationError(
      `Redis key '${this.keys.hash}' holds a ${type}, not the hash of live limits: ${consequence}; delete it (or choose another keyPrefix) and write the limits again`,
    );
  }
}

/** Redis's reply to a hash command on a key of another type. */
function isWrongType(error: unknown): boolean {
  return error instanceof Error && error.message.includes('WRONGTYPE');
}

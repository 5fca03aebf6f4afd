import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';
import { RuleThresholds, type Thresholds } from '../limiter/rule-thresholds.js';
import type { RateLimitConfigCentre, RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import { parseLimitSettings, settingsAsOverride, throwProblems } from '../rules/limit-settings.js';
import { RateLimitConfigurationError, type RateLimitMode, type RateLimitRule } from '../rules/rate-limit-rule.js';
import type { AuthoredChanges, RateLimitChangeAuthor } from './authored-changes.js';
import { checkLimitValues } from './check-limit-values.js';
import type { KnownRules } from './known-rules.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { permitted, writableCentre } from './management-refusals.js';

/** How many keys with values written `list` looks at beyond those rules read: a few HSCAN calls. */
const LIST_MAX_WRITTEN_KEYS = 100;

/** A config key: the values written for it, and what each rule that reads it counts with. */
export interface RateLimitLimitEntry {
  configKey: string;
  /** Written live (`set`), or undefined. */
  written: RateLimitOverride | undefined;
  rules: {
    name: string;
    declaredOn: string;
    /** The decorator's (with the module's mode). */
    declared: { count: number; windowMs: number; algorithm: RateLimitAlgorithmName; mode: RateLimitMode };
    /** In force on this instance now: the config centre's values where valid, else the decorator's. */
    inForce: { count: number; windowMs: number; algorithm: RateLimitAlgorithmName; mode: RateLimitMode };
  }[];
}

/**
 * The live values of config keys, as `RateLimitManagementService` writes and reads them: `set`,
 * `get`, `list` and `delete`, each key shown with the rules that read it, as declared and as in
 * force. A write is checked against every rule known to read the key before it is written.
 */
export class LimitManagement {
  private readonly thresholds: RuleThresholds;

  constructor(
    private readonly centre: RateLimitConfigCentre,
    private readonly rules: KnownRules,
    private readonly changes: AuthoredChanges,
    private readonly mode: RateLimitMode,
  ) {
    this.thresholds = new RuleThresholds(centre, mode);
  }

  /** `RateLimitManagementService.set`. */
  set(configKey: string, values: RateLimitOverride, author?: RateLimitChangeAuthor): Promise<RateLimitLimitEntry> {
    return permitted('set', () => this.write(configKey, values, author));
  }

  private async write(
    configKey: string,
    values: RateLimitOverride,
    author: RateLimitChangeAuthor | undefined,
  ): Promise<RateLimitLimitEntry> {
    const centre = writableCentre(this.centre, 'set');
    const rules = await this.rules.reading(configKey);
    // A Map, not an object: a field named `__proto__` stays a field (and is refused as one),
    // instead of becoming the prototype whose fields the check would then read as given.
    const merged = new Map(Object.entries((await this.read(centre, [configKey])).get(configKey) ?? {}));
    for (const [field, value] of Object.entries(values ?? {})) {
      if (value === null || value === '') merged.delete(field);
      else if (value !== undefined) merged.set(field, value);
    }
    const given = Object.fromEntries(merged);
    if (rules.length === 0) {
      // The module's allow list: what the key holds is read as nothing else.
      const others = [...merged.keys()].filter((field) => field !== 'allow');
      throwProblems(
        `RateLimitManagementService.set`,
        others.map(
          (field) =>
            `config key '${configKey}' holds the module's allow list: '${field}' is not a setting of it (only 'allow')`,
        ),
      );
    }
    throwProblems(`RateLimitManagementService.set`, checkLimitValues(configKey, given, rules));
    const written = settingsAsOverride(parseLimitSettings(given).settings);
    await this.changes.record(author, { change: 'set', configKey, values: { ...written } });
    await centre.write(configKey, written);
    // What was written, and what this instance holds now: no second read of Redis.
    return this.entry(configKey, rules, new Map([[configKey, written]]));
  }

  /** `RateLimitManagementService.get`. */
  async get(configKey: string): Promise<RateLimitLimitEntry> {
    return this.entry(configKey, await this.rules.reading(configKey));
  }

  /** `RateLimitManagementService.list`. */
  async list(): Promise<RateLimitLimitEntry[]> {
    const rules = await this.rules.all();
    const read = new Set(rules.flatMap((rule) => rule.configKey ?? []));
    const others = this.centre instanceof LiveConfigCentre ? await this.writtenKeys(this.centre) : [];
    const keys = [...new Set([...read, ...others])].sort();
    const written = await this.written(keys);
    return Promise.all(
      keys.map((configKey) =>
        this.entry(
          configKey,
          rules.filter((rule) => rule.configKey === configKey),
          written,
        ),
      ),
    );
  }

  /** `RateLimitManagementService.delete`. */
  async delete(configKey: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const centre = writableCentre(this.centre, 'delete');
    return permitted('delete', async () => {
      await this.changes.record(author, { change: 'delete', configKey });
      return centre.remove(configKey);
    });
  }

  /** The values written for these keys, from their source; while it is away, as this instance holds them. */
  private async written(configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    if (!(this.centre instanceof LiveConfigCentre)) return new Map();
    return this.read(this.centre, configKeys);
  }

  private read(centre: LiveConfigCentre, configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    return centre.read(configKeys).catch((error: unknown) => {
      // A source that cannot be used as it is (a key of another type in place of the hash) says so.
      if (error instanceof RateLimitConfigurationError) throw error;
      return centre.held();
    });
  }

  private writtenKeys(centre: LiveConfigCentre): Promise<string[]> {
    return centre.writtenKeys(LIST_MAX_WRITTEN_KEYS).catch((error: unknown) => {
      if (error instanceof RateLimitConfigurationError) throw error;
      return [...centre.held().keys()];
    });
  }

  private async entry(
    configKey: string,
    rules: readonly RateLimitRule[],
    written?: Map<string, RateLimitOverride>,
  ): Promise<RateLimitLimitEntry> {
    const values = (written ?? (await this.written([configKey]))).get(configKey);
    const own = new Set(this.rules.own());
    // Another app's rule (catalogued) is in force on its instances as the values written make it;
    // this instance neither holds nor serves them.
    const asWritten = new RuleThresholds({ get: (key) => (key === configKey ? values : undefined) }, this.mode);
    return {
      configKey,
      written: values,
      rules: rules.map((rule) => ({
        name: rule.name,
        declaredOn: rule.declaredOn,
        declared: limitsOf(this.thresholds.declaredOf(rule)),
        // As the limiter reckons them for a request: the same checks, the same fallback.
        inForce: limitsOf((own.has(rule) ? this.thresholds : asWritten).resolve(rule)),
      })),
    };
  }
}

function limitsOf({ count, windowMs, algorithm, mode }: Thresholds): RateLimitLimitEntry['rules'][number]['inForce'] {
  return { count, windowMs, algorithm, mode };
}

import { EVERY_RULE, type RateLimitConfigCentre, type RateLimitOverride } from '../limiter/rate-limit-config-centre.js';
import type { ResolvedRateLimitOptions } from '../module/options.js';
import { type TimeOrDuration, parseEndTime } from '../rules/duration.js';
import { parseLimitSettings, settingsAsOverride, throwProblems } from '../rules/limit-settings.js';
import { RateLimitConfigurationError } from '../rules/rate-limit-rule.js';
import type { AuthoredChanges, RateLimitChangeAuthor } from './authored-changes.js';
import { checkLimitValues } from './check-limit-values.js';
import { type CountingOfEntry, identityAsCounted } from './identity-as-counted.js';
import type { RateLimitBan, RateLimitIdentityOverride } from './identity-entries.js';
import type { KnownRule, KnownRules } from './known-rules.js';
import { permitted, writableCentre } from './management-refusals.js';

/**
 * Bans and per-identity overrides, as `RateLimitManagementService` writes and lists them: each
 * identity taken as the rules it reaches count it (an address as they key it), each end time checked,
 * each override checked as any limit is, and every change recorded before it is made.
 */
export class IdentityEntryManagement {
  constructor(
    private readonly centre: RateLimitConfigCentre,
    private readonly rules: KnownRules,
    private readonly changes: AuthoredChanges,
    private readonly options: Pick<ResolvedRateLimitOptions, 'ipv6PrefixBits' | 'clock'>,
  ) {}

  /** `RateLimitManagementService.ban`. */
  async ban(rule: string, identity: string, until: Date | string | number, author?: RateLimitChangeAuthor) {
    const entries = writableCentre(this.centre, 'ban').identities;
    const ruleName = await this.rules.nameOrEvery(rule, 'ban');
    const counted = identityAsCounted(identity, 'ban', await this.countingOfBan(ruleName));
    const ends = this.endOf(until, 'ban');
    await permitted('ban', async () => {
      await this.changes.record(author, {
        change: 'ban',
        rules: [ruleName],
        identity: counted,
        until: new Date(ends).toISOString(),
      });
      await entries.ban(ruleName, counted, ends);
    });
    return { rule: ruleName, identity: counted, until: new Date(ends).toISOString() };
  }

  /** `RateLimitManagementService.unban`. */
  async unban(rule: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = writableCentre(this.centre, 'unban').identities;
    const ruleName = await this.rules.nameOrEvery(rule, 'unban');
    const counted = identityAsCounted(identity, 'unban', { ...(await this.countingOfBan(ruleName)), lenient: true });
    return permitted('unban', async () => {
      await this.changes.record(author, { change: 'unban', rules: [ruleName], identity: counted });
      // A ban written with the address as given (by an earlier version) goes too.
      return (await entries.unban(ruleName, counted)) || (counted !== identity && entries.unban(ruleName, identity));
    });
  }

  /** `RateLimitManagementService.bans`. */
  bans(): Promise<RateLimitBan[]> {
    return permitted('bans', () => writableCentre(this.centre, 'bans').identities.listBans(), '');
  }

  /** `RateLimitManagementService.setOverride`. */
  async setOverride(
    configKey: string,
    identity: string,
    values: RateLimitOverride,
    until: Date | string | number,
    author?: RateLimitChangeAuthor,
  ): Promise<RateLimitIdentityOverride> {
    const entries = writableCentre(this.centre, 'setOverride').identities;
    const known = await this.rules.all();
    const rules = await this.rules.reading(configKey, known);
    const subject = `RateLimitManagementService.setOverride`;
    throwProblems(subject, overrideKeyProblems(configKey, rules, known));
    const counted = identityAsCounted(identity, 'setOverride', this.countingOfOverride(configKey, rules));
    const given = Object.fromEntries(Object.entries(values ?? {}).filter(([, value]) => value !== undefined));
    const others = Object.keys(given).filter((field) => field !== 'count' && field !== 'window');
    throwProblems(
      subject,
      others.map((field) => `'${field}' cannot be set per identity (only count and window)`),
    );
    if (Object.keys(given).length === 0) throwProblems(subject, ["give 'count', 'window' or both"]);
    throwProblems(subject, checkLimitValues(configKey, given, rules));
    const written = settingsAsOverride(parseLimitSettings(given).settings);
    const ends = this.endOf(until, 'setOverride');
    const entry = { configKey, identity: counted, values: written, until: new Date(ends).toISOString() };
    await permitted('setOverride', async () => {
      await this.changes.record(author, {
        change: 'set-override',
        configKey,
        identity: counted,
        values: { ...written },
        until: entry.until,
      });
      await entries.setOverride(configKey, counted, written, ends);
    });
    return entry;
  }

  /** `RateLimitManagementService.deleteOverride`. */
  async deleteOverride(configKey: string, identity: string, author?: RateLimitChangeAuthor): Promise<boolean> {
    const entries = writableCentre(this.centre, 'deleteOverride').identities;
    // The rules reading the key now: none (a key renamed since) takes the identity as given.
    const rules = (await this.rules.all()).filter((rule) => rule.configKey === configKey);
    const counted = identityAsCounted(identity, 'deleteOverride', {
      ...this.countingOfOverride(configKey, rules),
      lenient: true,
    });
    return permitted('deleteOverride', async () => {
      await this.changes.record(author, { change: 'delete-override', configKey, identity: counted });
      // An override written with the address as given (by an earlier version) goes too.
      return (
        (await entries.deleteOverride(configKey, counted)) ||
        (counted !== identity && entries.deleteOverride(configKey, identity))
      );
    });
  }

  /** `RateLimitManagementService.overrides`. */
  overrides(): Promise<RateLimitIdentityOverride[]> {
    return permitted('overrides', () => writableCentre(this.centre, 'overrides').identities.listOverrides(), '');
  }

  /**
   * How a ban under `rule` is matched: as an address in the rule's app where it counts by address;
   * for `'*'`, which every app matches against the client address, in every app whose rules are
   * known (this process's own without any).
   */
  private async countingOfBan(rule: string): Promise<CountingOfEntry> {
    const known = await this.rules.all();
    if (rule !== EVERY_RULE) {
      return { ...this.countingOf(known.filter((each) => each.name === rule)), subject: `rule "${rule}"` };
    }
    return {
      prefixBits: known.length === 0 ? [this.options.ipv6PrefixBits] : known.map((each) => this.prefixBitsOf(each)),
      addressesOnly: known.length > 0 && known.every((each) => each.by === 'ip'),
      subject: 'every rule',
      networks: true,
    };
  }

  private countingOfOverride(configKey: string, rules: readonly KnownRule[]): CountingOfEntry {
    return { ...this.countingOf(rules), subject: `every rule of config key '${configKey}'`, networks: false };
  }

  /** The `ipv6PrefixBits` of the apps of those rules that count by client address, and whether all do. */
  private countingOf(rules: readonly KnownRule[]): Omit<CountingOfEntry, 'subject'> {
    const byAddress = rules.filter((rule) => rule.by === 'ip');
    return {
      prefixBits: byAddress.map((rule) => this.prefixBitsOf(rule)),
      addressesOnly: byAddress.length > 0 && byAddress.length === rules.length,
      networks: true,
    };
  }

  /** An own rule counts with this module's prefix; a catalogued one with its app's, where catalogued. */
  private prefixBitsOf(rule: KnownRule): number {
    return rule.ipv6PrefixBits ?? this.options.ipv6PrefixBits;
  }

  /** When an entry given `until` ends, in ms on the module's clock; throws unless in the next 365 days. */
  private endOf(until: TimeOrDuration, method: string): number {
    const ends = parseEndTime(until, this.options.clock?.() ?? Date.now());
    if ('problem' in ends) {
      throw new RateLimitConfigurationError(
        `RateLimitManagementService.${method}: 'until' ${ends.problem}, got ${JSON.stringify(until)}`,
      );
    }
    return ends.at;
  }
}

/**
 * Why a config key takes no per-identity override: the module's allow list has no thresholds (no
 * rule reads it), and a rule with `tiers` counts its requests under their tier's key, where an
 * override of its own key would never be read for them.
 */
function overrideKeyProblems(configKey: string, rules: readonly KnownRule[], known: readonly KnownRule[]): string[] {
  if (rules.length === 0) {
    return [
      `config key '${configKey}' holds the module's allow list, which has no count or window to override; give a rule's config key`,
    ];
  }
  return rules.flatMap((rule) => {
    if (rule.tierName !== undefined) return [];
    const tierKeys = known
      .filter((tier) => tier.name === rule.name && tier.tierName !== undefined)
      .flatMap((tier) => tier.configKey ?? []);
    if (tierKeys.length === 0) return [];
    return [
      `config key '${configKey}': rule ${JSON.stringify(rule.name)} counts by tier, each tier under its own key (${tierKeys.map((key) => `'${key}'`).join(', ')}); set the override on the key of the identity's tier`,
    ];
  });
}

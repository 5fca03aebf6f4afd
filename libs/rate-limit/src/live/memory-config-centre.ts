import { Inject, Injectable, Optional } from '@nestjs/common';
import type { ConfigService } from '@nestjs/config';
import { APP_CONFIG_SERVICE } from '../limiter/app-config.js';
import { LiveConfigCentre } from './live-config-centre.js';
import { NestConfigCentre } from '../limiter/nest-config-centre.js';
import { IdentityEntries } from './identity-entries.js';
import { RESOLVED_RATE_LIMIT_OPTIONS } from '../module/options.js';
import type { RateLimitOverride } from '../limiter/rate-limit-config-centre.js';

/**
 * A live config centre in this process: values written through `RateLimitManagementService` apply
 * from the next request, over `ConfigService`'s (when `ConfigModule` is imported). For a single
 * instance, or the embedded store; instances that share counters share limits with `RedisConfigCentre`.
 */
@Injectable()
export class MemoryConfigCentre extends LiveConfigCentre {
  private readonly values = new Map<string, RateLimitOverride>();

  constructor(
    @Optional() @Inject(APP_CONFIG_SERVICE) config?: ConfigService | null,
    // The module's key prefix and clock, which bans and overrides end on.
    @Optional() @Inject(RESOLVED_RATE_LIMIT_OPTIONS) options?: { keyPrefix?: string; clock?: () => number } | null,
  ) {
    super(
      config ? new NestConfigCentre(config) : undefined,
      new IdentityEntries(options?.keyPrefix ?? 'rl', options?.clock ?? Date.now),
    );
  }

  protected current(configKey: string): RateLimitOverride | undefined {
    return this.values.get(configKey);
  }

  read(configKeys: readonly string[]): Promise<Map<string, RateLimitOverride>> {
    const found = new Map<string, RateLimitOverride>();
    for (const configKey of configKeys) {
      const values = this.values.get(configKey);
      if (values) found.set(configKey, values);
    }
    return Promise.resolve(found);
  }

  writtenKeys(max: number): Promise<string[]> {
    return Promise.resolve([...this.values.keys()].slice(0, max));
  }

  held(): Map<string, RateLimitOverride> {
    return new Map(this.values);
  }

  write(configKey: string, values: RateLimitOverride): Promise<void> {
    // A new object: the limiter validates a rule with a key's values once per object.
    this.values.set(configKey, { ...values });
    return Promise.resolve();
  }

  remove(configKey: string): Promise<boolean> {
    return Promise.resolve(this.values.delete(configKey));
  }
}

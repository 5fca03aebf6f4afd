import { Injectable } from '@nestjs/common';
import { ConfigService } from '@nestjs/config';
import { RateLimitConfigCentre, type RateLimitOverride } from './rate-limit-config-centre.js';

/**
 * The default config centre: reads `@nestjs/config`'s `ConfigService`. For `configKey: 'orders.list'`:
 *
 * - `limits.orders.list.count` / `limits.orders.list.window` (nested configuration, `ConfigService.set`), else
 * - `RATE_LIMIT_ORDERS_LIST_COUNT` / `RATE_LIMIT_ORDERS_LIST_WINDOW` (env or `.env`; the key upper-cased,
 *   every character other than a letter or digit replaced by `_`).
 */
@Injectable()
export class NestConfigCentre extends RateLimitConfigCentre {
  private readonly paths = new Map<string, readonly [string, string, string, string]>();
  /** The last values returned per key: the same object while they stand, so they are validated once. */
  private readonly last = new Map<string, RateLimitOverride>();

  constructor(private readonly config: ConfigService) {
    super();
  }

  get(configKey: string): RateLimitOverride | undefined {
    const [countPath, windowPath, countEnv, windowEnv] = this.pathsFor(configKey);
    const count = this.config.get<unknown>(countPath) ?? this.config.get<unknown>(countEnv);
    const window = this.config.get<unknown>(windowPath) ?? this.config.get<unknown>(windowEnv);
    if (count === undefined && window === undefined) return undefined;
    const last = this.last.get(configKey);
    if (last && last.count === count && last.window === window) return last;
    const override = { count, window };
    this.last.set(configKey, override);
    return override;
  }

  private pathsFor(configKey: string): readonly [string, string, string, string] {
    let paths = this.paths.get(configKey);
    if (!paths) {
      const env = `RATE_LIMIT_${configKey.toUpperCase().replace(/[^A-Z0-9]/g, '_')}`;
      paths = [`limits.${configKey}.count`, `limits.${configKey}.window`, `${env}_COUNT`, `${env}_WINDOW`];
      this.paths.set(configKey, paths);
    }
    return paths;
  }
}

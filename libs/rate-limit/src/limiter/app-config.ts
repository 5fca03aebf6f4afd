import { Inject, Optional } from '@nestjs/common';
import type { ModuleRef } from '@nestjs/core';
import type { ConfigService } from '@nestjs/config';

/**
 * @internal The token of the app's `ConfigService` as `RateLimitModule` sees it (`ConfigModule`
 * imported with `isGlobal`, say), or null: without `ConfigModule`, or without `@nestjs/config`.
 */
export const APP_CONFIG_SERVICE = Symbol('RATE_LIMIT_APP_CONFIG_SERVICE');

/**
 * @internal
 * The `ConfigService` a provider of the module given would be injected with `@Optional()`, or null.
 * `@nestjs/config` is an optional peer: it is loaded here, when the module starts, and its absence
 * means no `ConfigService`, as a `ConfigModule` not imported does.
 */
export async function appConfigService(moduleRef: ModuleRef): Promise<ConfigService | null> {
  let config: typeof import('@nestjs/config');
  try {
    config = await import('@nestjs/config');
  } catch (error) {
    if ((error as { code?: unknown }).code !== 'ERR_MODULE_NOT_FOUND') throw error;
    return null;
  }
  // The token is a class only known once loaded, so the lookup is made as a constructor's would
  // be: in the module's own context (its providers, its imports, the global modules), not anywhere
  // in the app, as `moduleRef.get(…, { strict: false })` would.
  class Lookup {
    constructor(readonly config: ConfigService | undefined) {}
  }
  Inject(config.ConfigService)(Lookup, undefined, 0);
  Optional()(Lookup, undefined, 0);
  return (await moduleRef.create(Lookup)).config ?? null;
}

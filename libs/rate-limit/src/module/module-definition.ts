/** The options token and the forRoot/forRootAsync plumbing that `RateLimitModule` builds on (internal). */
import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { RateLimitModuleExtras, RateLimitModuleOptions } from './options.js';

export const { ConfigurableModuleClass: RateLimitConfigurableModule, MODULE_OPTIONS_TOKEN: RATE_LIMIT_OPTIONS } =
  new ConfigurableModuleBuilder<RateLimitModuleOptions>()
    .setClassMethodName('forRoot')
    .setExtras<Required<RateLimitModuleExtras>>(
      { isGlobal: false, globalGuard: true, defaults: [], extensions: [] },
      (definition, extras) => ({
        ...definition,
        global: extras.isGlobal,
      }),
    )
    .build();

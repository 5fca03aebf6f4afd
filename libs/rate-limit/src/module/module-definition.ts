import { ConfigurableModuleBuilder } from '@nestjs/common';
import type { RateLimitModuleExtras, RateLimitModuleOptions } from './options.js';

export const {
  ConfigurableModuleClass: RateLimitConfigurableModule,
  MODULE_OPTIONS_TOKEN: RATE_LIMIT_OPTIONS,
  OPTIONS_TYPE: RATE_LIMIT_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: RATE_LIMIT_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<RateLimitModuleOptions>()
  .setClassMethodName('forRoot')
  .setExtras<Required<RateLimitModuleExtras>>({ isGlobal: false, globalGuard: true }, (definition, extras) => ({
    ...definition,
    global: extras.isGlobal,
  }))
  .build();

import {
  Injectable,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import { RateLimitConfigCentre } from './rate-limit-config-centre.js';

type Hooks = Partial<OnModuleInit & OnApplicationBootstrap & OnModuleDestroy & OnApplicationShutdown>;

/** Config centres the module created from a class given as `configCentre` (`ModuleRef.create`). */
export const CREATED_CONFIG_CENTRES = new WeakSet<RateLimitConfigCentre>();

/**
 * Calls the lifecycle hooks of a config centre the module created from a class: Nest calls them
 * only for the providers it registered, and a centre that subscribes or polls must start and stop
 * with the app. A centre given as an instance is its owner's to start and stop.
 */
@Injectable()
export class ConfigCentreLifecycle
  implements OnModuleInit, OnApplicationBootstrap, OnModuleDestroy, OnApplicationShutdown
{
  private readonly hooks: Hooks | undefined;

  constructor(centre: RateLimitConfigCentre) {
    this.hooks = CREATED_CONFIG_CENTRES.has(centre) ? (centre as Hooks) : undefined;
  }

  async onModuleInit(): Promise<void> {
    await this.hooks?.onModuleInit?.();
  }

  async onApplicationBootstrap(): Promise<void> {
    await this.hooks?.onApplicationBootstrap?.();
  }

  async onModuleDestroy(): Promise<void> {
    await this.hooks?.onModuleDestroy?.();
  }

  async onApplicationShutdown(signal?: string): Promise<void> {
    await this.hooks?.onApplicationShutdown?.(signal);
  }
}

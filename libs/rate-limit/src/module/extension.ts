import type { InjectionToken, Provider } from '@nestjs/common';

/**
 * A part of the library an app adds to `RateLimitModule` only when it wants it, from the entry that
 * ships it: `rateLimitManagement()` from `nest-rate-limit/live`; `rateLimitMetrics()`,
 * `rateLimitHealth()` and `rateLimitKeyAudit()` from `nest-rate-limit/ops`. Given to `forRoot` (or
 * `forRootAsync`, beside the factory):
 *
 * ```ts
 * RateLimitModule.forRoot({ redis, extensions: [rateLimitMetrics(), rateLimitHealth()] })
 * ```
 *
 * The module adds the extension's providers to its own and exports what apps inject; an app that
 * adds none makes none of them. The core never imports an extension: it offers seams (the
 * `DecisionObserver` the store stack tells, steps run by the limiter) that an extension fills.
 */
export interface RateLimitExtension {
  /** The function that made it, for messages: `'rateLimitMetrics'`. */
  readonly name: string;
  /** @internal Providers added to the module. */
  readonly providers: readonly Provider[];
  /** @internal Those of them apps inject, exported by the module. */
  readonly exports?: readonly InjectionToken[];
  /**
   * @internal Tokens of providers (among `providers`) whose value is a limiter step (`StepEntry`),
   * run after the module's own steps, in the order the extensions are given.
   */
  readonly steps?: readonly InjectionToken[];
}

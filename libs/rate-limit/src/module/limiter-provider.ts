import { type InjectionToken, Logger, type Provider } from '@nestjs/common';
import { DECISION_OBSERVER, type DecisionObserver } from '../limiter/decision-observer.js';
import { ExemptionProblems, ModuleExemptions } from '../limiter/exemptions.js';
import type { LimiterStep, StepEntry } from '../limiter/limiter-step.js';
import { LimiterSteps } from '../limiter/limiter-steps.js';
import { RateLimitConfigCentre } from '../limiter/rate-limit-config-centre.js';
import { RateLimiterService } from '../limiter/rate-limiter.service.js';
import { AllowListStep } from '../limiter/steps/allow-list.step.js';
import { CostReservationsStep } from '../limiter/steps/cost-reservations.step.js';
import { ConcurrencyStep } from '../limiter/steps/concurrency.step.js';
import { CountOnStep } from '../limiter/steps/count-on.step.js';
import { LeasesStep } from '../limiter/steps/leases.step.js';
import { ModuleExemptionsStep } from '../limiter/steps/module-exemptions.step.js';
import { NearLimitStep } from '../limiter/steps/near-limit.step.js';
import { RejectionLogStep } from '../limiter/steps/rejection-log.step.js';
import { ShadowStep } from '../limiter/steps/shadow.step.js';
import { SkipIfStep } from '../limiter/steps/skip-if.step.js';
import { TiersStep } from '../limiter/steps/tiers.step.js';
import { WaitStep } from '../limiter/steps/wait.step.js';
import { SampledLogger } from '../logging/sampled-logger.js';
import type { StoreProblemLog } from '../logging/store-problem-log.js';
import { RedisRateLimitStore } from '../redis/redis-rate-limit.store.js';
import { RedisService } from '../redis/redis.service.js';
import { BlockCacheStore, BlockedKeys } from '../resilience/block-cache.store.js';
import type { DecidingStore } from '../resilience/deciding-store.js';
import { LeasedUnits } from '../resilience/leased-units.js';
import { LeasingStore } from '../resilience/leasing.store.js';
import { ResilientStore } from '../resilience/resilient-store.js';
import { RateLimitRuleRegistry } from '../rules/rate-limit-rule.registry.js';
import { RateLimitStore } from '../store/rate-limit-store.js';
import { LAST_SEEN_MIN_KEYS, LEASE_MAX_KEYS, REJECTION_LOG_MAX_KEYS } from './defaults.js';
import { RESOLVED_RATE_LIMIT_OPTIONS, type ResolvedRateLimitOptions } from './options.js';
import { storeProblemLog } from './store-providers.js';

/*
 * The limiter as the module composes it, the one place that says what a request passes: the store
 * stack it decides with (`decidingStore`) and its steps (`limiterSteps`), each part made only where
 * an option or a rule uses it.
 */

/**
 * The store as the limiter uses it, from the layers the options ask for (`resilience/`): the
 * `storeErrors` policies and the local fallback around the store; and the block cache on them,
 * for a shared store that tells every instance of lowered counts.
 */
function decidingStore(
  store: RateLimitStore,
  problems: StoreProblemLog,
  { storeErrors, memoryStore, blockCache, clock }: ResolvedRateLimitOptions,
  observer: DecisionObserver | undefined,
  redis: RedisService,
): DecidingStore {
  let blocked: BlockedKeys | undefined;
  const resilient = new ResilientStore(store, problems, {
    policy: storeErrors.policy,
    localFallback: {
      ...storeErrors.localFallback,
      maxKeys: Math.max(memoryStore.maxKeys, LAST_SEEN_MIN_KEYS),
      instances: store instanceof RedisRateLimitStore ? () => redis.news.instances : undefined,
      storeSeemsDown: store instanceof RedisRateLimitStore ? () => redis.runner.seemsDown : undefined,
      // Units Redis counted for requests refused here, which this instance may admit with.
      banked: (key) => blocked?.forget([key]),
    },
    observer,
  });
  // Keys reset or refunded anywhere are forgotten by the fallback too; and listening is how the
  // instances are counted.
  store.watchLiftedKeys({ lifted: (keys) => resilient.forget(keys), listening: () => undefined });
  if (!store.shared || !blockCache) return resilient;
  const blockedKeys = new BlockedKeys(blockCache.maxKeys);
  blocked = blockedKeys;
  const watching = store.watchLiftedKeys({
    lifted: (keys) => blockedKeys.forget(keys),
    listening: (on) => blockedKeys.listening(on),
  });
  return watching ? new BlockCacheStore(resilient, blockedKeys, clock, observer) : resilient;
}

/**
 * The limiter, with what it alone uses made here: the store stack it decides with (`decidingStore`)
 * and its steps (`limiterSteps`), the extensions' last. The observer is an extension's
 * (`DECISION_OBSERVER`), or none.
 */
export function limiterProvider(extensionSteps: readonly InjectionToken[]): Provider {
  return {
    provide: RateLimiterService,
    inject: [
      RESOLVED_RATE_LIMIT_OPTIONS,
      RateLimitStore,
      RedisService,
      RateLimitRuleRegistry,
      RateLimitConfigCentre,
      { token: DECISION_OBSERVER, optional: true },
      ...extensionSteps,
    ],
    useFactory: (
      options: ResolvedRateLimitOptions,
      store: RateLimitStore,
      redis: RedisService,
      registry: RateLimitRuleRegistry,
      centre: RateLimitConfigCentre,
      observer: DecisionObserver | undefined,
      ...steps: StepEntry[]
    ): RateLimiterService => {
      const problems = storeProblemLog(redis);
      const deciding = decidingStore(store, problems, options, observer ?? undefined, redis);
      const composed = new LimiterSteps(limiterSteps(options, deciding, store, centre, steps, problems));
      return new RateLimiterService(options, deciding, problems, registry, centre, composed);
    },
  };
}

/**
 * The limiter's steps, in the order they run (the first wraps the store call outermost, and each
 * sees the outcome before the next): a rule feature's step is made when a rule using it is first
 * decided, an option's only when the option is set. The extensions' steps come last: the metrics'
 * count each decision after every other step has had its say (`nearLimit`).
 */
export function limiterSteps(
  options: ResolvedRateLimitOptions,
  deciding: DecidingStore,
  store: RateLimitStore,
  centre: RateLimitConfigCentre,
  extensionSteps: readonly StepEntry[],
  storeProblems: StoreProblemLog,
): StepEntry[] {
  const { clock, allow, skipIf } = options;
  // Where a failed `skipIf`, an allow list a centre gave that cannot be read, or `onNearLimit` is said.
  const problems = new ExemptionProblems();
  const entries: StepEntry[] = [
    // The centre's first: a banned identity is refused before any exemption can let it through. The
    // default centre (`NestConfigCentre`) brings none; a live one its bans and per-identity overrides.
    ...centre.limiterSteps(),
    // The module's `allow` and `skipIf` are unset by default (`resolveModuleOptions`): no step screens.
    ...(allow || skipIf
      ? [
          {
            make: () =>
              closing(
                new ModuleExemptionsStep(new ModuleExemptions(allow?.list, allow?.configKey, skipIf, centre, problems)),
                problems,
              ),
          },
        ]
      : []),
    // Each rule feature's step, for the rules that use it (`uses`): a default rule uses none of them.
    { uses: (rule) => rule.skipIf !== undefined, make: () => closing(new SkipIfStep(problems), problems) },
    { uses: (rule) => rule.tiers !== undefined, make: (kit) => new TiersStep(kit) },
    // A config key's values may bring an allow list.
    { uses: (rule) => rule.allow !== undefined || rule.configKey !== undefined, make: () => new AllowListStep() },
    // Outside `countOn`'s and the caps': the wait holds a request around their whole decision.
    {
      uses: (rule) => rule.wait !== undefined,
      make: () => {
        const step = new WaitStep();
        // Room given back on any instance (refunds, slots) wakes the waiters here.
        store.watchLiftedKeys({ lifted: (keys) => step.heard(keys), listening: (on) => step.listening(on) });
        return step;
      },
    },
    { uses: (rule) => rule.countOn !== 'all', make: () => new CountOnStep(options.countOn.inFlightWaitMs) },
    // After `countOn`'s, whose units it adds its slots to.
    {
      uses: (rule) => rule.concurrency !== undefined,
      make: () => new ConcurrencyStep(store, storeProblems, clock ? () => Math.floor(clock()) : () => undefined),
    },
    // A config key's values may turn a rule to 'shadow'. The module's `mode` is 'enforce' by default.
    {
      uses: (rule) => (rule.mode ?? options.mode) === 'shadow' || rule.configKey !== undefined,
      make: () => new ShadowStep(),
    },
    {
      uses: (rule) => rule.lease > 0,
      make: () => {
        const leasing = leasingStore(deciding, store, clock);
        // A store that does not tell every instance of lowered counts keeps no leases: a reset
        // elsewhere could not drop the units leased here.
        return leasing ? new LeasesStep(leasing, clock ? () => Math.floor(clock()) : () => undefined) : {};
      },
    },
    { uses: (rule) => rule.nearLimit !== undefined, make: () => nearLimitStep(options.onNearLimit, problems) },
    { uses: (rule) => rule.settleCost !== undefined, make: () => new CostReservationsStep() },
  ];
  const { logging } = options;
  if (logging) {
    const log = new SampledLogger(new Logger('RateLimit'), {
      ...logging,
      maxKeys: REJECTION_LOG_MAX_KEYS,
      summary: 'Rejected requests of other keys',
    });
    // Every request's, on by default: it hears refusals only, so an admission runs no step.
    entries.push({ make: () => new RejectionLogStep(log) });
  }
  entries.push(...extensionSteps);
  return entries;
}

function leasingStore(
  inner: DecidingStore,
  store: RateLimitStore,
  clock: (() => number) | undefined,
): LeasingStore | undefined {
  if (!store.shared) return undefined;
  const leases = new LeasedUnits(LEASE_MAX_KEYS);
  const watching = store.watchLiftedKeys({
    lifted: (keys) => leases.forget(keys),
    listening: (on) => leases.listening(on),
  });
  return watching ? new LeasingStore(inner, leases, clock) : undefined;
}

/** The module's `onNearLimit`, made never to throw into a request: a failure is logged by sampling. */
function nearLimitStep(onNearLimit: ResolvedRateLimitOptions['onNearLimit'], problems: ExemptionProblems): LimiterStep {
  if (!onNearLimit) return new NearLimitStep(undefined);
  const step = new NearLimitStep((event) => {
    try {
      const done = onNearLimit(event) as unknown;
      if (done instanceof Promise) done.catch((error: unknown) => problems.hookFailed('onNearLimit', error));
    } catch (error) {
      problems.hookFailed('onNearLimit', error);
    }
  });
  return closing(step, problems);
}

/** A step that says what its problems log holds at shutdown (each of its steps may: a flush is idempotent). */
function closing<Step extends LimiterStep>(step: Step, problems: ExemptionProblems): Step {
  return Object.assign(step, { close: () => problems.close() });
}

import { Logger } from '@nestjs/common';
import type { LimitedRequest } from './limited-request.js';
import type { RateLimitConfigCentre } from './rate-limit-config-centre.js';
import { SampledLogger } from '../logging/sampled-logger.js';
import { describeError } from '../logging/describe-error.js';
import { LOG_SAMPLING, REJECTION_LOG_MAX_KEYS } from '../module/defaults.js';
import { AllowList } from '../rules/allow-list.js';
import type { RateLimitSkipIf } from '../rules/rate-limit-rule.js';

/**
 * Where a `skipIf` or an `onNearLimit` that failed, or an allow list a config centre gave that
 * cannot be read, is said:
 * by sampling, at most a line per rule per 10 s, however many requests (or GraphQL aliases) hit it.
 */
export class ExemptionProblems {
  private readonly log = new SampledLogger(new Logger('RateLimit'), {
    ...LOG_SAMPLING,
    level: 'warn',
    maxKeys: REJECTION_LOG_MAX_KEYS,
    summary: 'Failed skipIf calls of other rules',
  });

  /** A `skipIf` threw or rejected: the request is decided as if it were not there (fail closed). */
  skipFailed(where: string, error: unknown): false {
    this.log.record(
      `skipIf:${where}`,
      () => `skipIf of ${where} failed (${describeError(error)}); such requests are counted as if it said false`,
    );
    return false;
  }

  /** A hook of the app's (`onNearLimit`) threw: the request goes on. */
  hookFailed(hook: string, error: unknown): void {
    this.log.record(`hook:${hook}`, () => `${hook} failed (${describeError(error)}); requests go on`);
  }

  refusedAllowList(configKey: string, problems: readonly string[]): void {
    this.log.record(
      `allow:${configKey}`,
      () => `Refused the allow list of config key '${configKey}' (${problems.join('; ')}); the one given in code stays`,
    );
  }

  close(): void {
    this.log.close();
  }
}

/**
 * Whether a `skipIf` skips: its answer, truthy or not; false when it throws or rejects (fail closed).
 * At once when it answers at once, so a synchronous `skipIf` makes no promise.
 */
export function skips(
  skipIf: RateLimitSkipIf,
  request: LimitedRequest,
  where: string,
  problems: ExemptionProblems,
): boolean | Promise<boolean> {
  try {
    const answer = skipIf(request.context) as unknown;
    // Any thenable (a query builder's, say), not only a native promise: its answer decides.
    if (typeof (answer as { then?: unknown } | null)?.then === 'function') {
      return Promise.resolve(answer).then(Boolean, (error: unknown) => problems.skipFailed(where, error));
    }
    return Boolean(answer);
  } catch (error) {
    return problems.skipFailed(where, error);
  }
}

/**
 * The module-wide exemptions, the `allow` and `skipIf` options; made only when one is given. A
 * request from an allowed address, or with an allowed user agent from its networks, or one `skipIf` skips, is counted by no rule and
 * gets no headers; an allowed identity is not counted by the rules that count it under that identity.
 */
export class ModuleExemptions {
  /** The config centre's last `allow` value and the list made of it (the same object while it stands). */
  private live: { value: unknown; list: AllowList | undefined } | undefined;

  constructor(
    private readonly given: AllowList | undefined,
    private readonly configKey: string | undefined,
    private readonly skipIf: RateLimitSkipIf | undefined,
    private readonly centre: RateLimitConfigCentre,
    private readonly problems: ExemptionProblems,
  ) {}

  /** The allow list in force: the config centre's `allow` for `configKey` where it gives a valid one, else the option's. */
  list(): AllowList | undefined {
    if (this.configKey === undefined) return this.given;
    let value: unknown;
    try {
      value = this.centre.get(this.configKey)?.allow;
    } catch {
      // A centre that fails is said by the rules reading it; the list given in code stands.
      return this.given;
    }
    if (value === undefined) return this.given;
    if (this.live?.value !== value) {
      const { list, problems } = AllowList.parse(typeof value === 'string' ? parseJson(value) : value);
      if (problems.length > 0) this.problems.refusedAllowList(this.configKey, problems);
      this.live = { value, list: problems.length > 0 ? this.given : list };
    }
    return this.live.list;
  }

  /** Whether no rule counts this request: its address (or user agent from its networks) allowed, or `skipIf` says so. */
  skipsRequest(request: LimitedRequest): boolean | Promise<boolean> {
    const list = this.list();
    if (list?.readsRequest && list.allowsClient(request.address, request.userAgent())) return true;
    return this.skipIf ? skips(this.skipIf, request, 'the module', this.problems) : false;
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

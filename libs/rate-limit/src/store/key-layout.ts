import { createHash } from 'node:crypto';
import type { RateLimitAlgorithmName } from '../algorithms/algorithm.js';

/** Identities used in keys as they are: short, and nothing that could pick a Cluster slot (braces). */
const PLAIN_IDENTITY = /^[A-Za-z0-9._:-]{1,64}$/;

const ALGORITHM_TAG: Record<RateLimitAlgorithmName, string> = {
  'fixed-window': 'fw',
  'sliding-window': 'sw',
  'sliding-log': 'sl',
  'token-bucket': 'tb',
  gcra: 'gc',
};

/**
 * Stands for requests whose `by` resolver gave no identity. `~` is in no plain identity and no
 * digest, so no real identity shares its counter.
 */
export const ANONYMOUS_IDENTITY = '~anonymous';

/**
 * The identity as it appears in keys: itself when short and plain, `#` and its SHA-256 otherwise,
 * and `~anonymous` for `null` (no identity).
 */
export function identityPart(identity: string | null): string {
  if (identity === null) return ANONYMOUS_IDENTITY;
  return PLAIN_IDENTITY.test(identity) ? identity : `#${createHash('sha256').update(identity).digest('base64url')}`;
}

/** Rule names used in keys as they are: no longer than a digest id, so no rule's keys are longer for it. */
const PLAIN_RULE_ID = /^[A-Za-z0-9._$-]{1,9}$/;

/** Base64url characters of the SHA-256 of a rule name in its digest id: 48 bits. */
const RULE_DIGEST_CHARS = 8;

/**
 * A rule as it appears in keys: its name when short and plain (`login`, `orders`), otherwise `~`
 * and 8 base64url characters of the SHA-256 of its name (`PingController.ping` becomes
 * `~fBUkyazd`). The same on every instance and deploy, with nothing to coordinate; never `:`, `{`
 * or `}`. `~` is in no rule name, so a name and a digest never meet. Two names of one digest would
 * share counters: the rule registry refuses them at bootstrap.
 */
export function ruleKeyId(ruleName: string): string {
  if (PLAIN_RULE_ID.test(ruleName)) return ruleName;
  return `~${createHash('sha256').update(ruleName).digest('base64url').slice(0, RULE_DIGEST_CHARS)}`;
}

/**
 * The state key of a rule for an identity: `prefix:{identity}:rule:algorithm`, the rule as its
 * `ruleKeyId`. The identity is the hash tag, so all keys of one identity share a Cluster slot; the
 * digest form starts with `#`, which no plain identity contains, so two identities never share a
 * key. The algorithm is part of the key so that changing a rule's algorithm never reads state of
 * another shape.
 *
 * @example rateLimitKey('rl', 'PingController.ping', '127.0.0.1', 'fixed-window') // 'rl:{127.0.0.1}:~fBUkyazd:fw'
 */
export function rateLimitKey(
  prefix: string,
  ruleName: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): string {
  return ruleStateKey(prefix, ruleKeyId(ruleName), identity, algorithm);
}

/** `rateLimitKey` for a rule whose `ruleKeyId` is known (a compiled rule's `keyId`): no digest per request. */
export function ruleStateKey(
  prefix: string,
  keyId: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): string {
  return `${prefix}:{${identityPart(identity)}}:${keyId}:${ALGORITHM_TAG[algorithm]}`;
}

/**
 * The rule id of a key of the layout (a state key or one beside it): its segment before the last,
 * since neither an id nor an algorithm tag holds a `:`. For showing keys to people, with the names
 * of the rules known (`ruleKeyId` of each).
 */
export function keyIdOf(key: string): string {
  const end = key.lastIndexOf(':');
  return key.slice(key.lastIndexOf(':', end - 1) + 1, end);
}

/** The keys a store may keep beside a state key: in the same hash slot, shared by the rule's algorithms. */
export interface RateLimitKeysBeside {
  /** The time a `blockFor` penalty ends. */
  blockKey: string;
  /** Redis, fixed window: the window's count once high, kept as long as the window (a failover defence). */
  markerKey: string;
  /** `countOn` admissions whose responses have not ended. */
  pendingKey: string;
}

/** The keys beside a state key: its last segment (the algorithm) replaced. */
export function keysBeside(key: string): RateLimitKeysBeside {
  const base = key.slice(0, key.lastIndexOf(':'));
  return { blockKey: `${base}:block`, markerKey: `${base}:mark`, pendingKey: `${base}:pend` };
}

/** Every key of a rule (by its name) for an identity: the documented layout, for tools and tests. */
export function rateLimitKeys(
  prefix: string,
  ruleName: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): { key: string } & RateLimitKeysBeside {
  const key = rateLimitKey(prefix, ruleName, identity, algorithm);
  return { key, ...keysBeside(key) };
}

/**
 * Where the live limits are (`RedisConfigCentre`): the hash of values by config key (the one key
 * kept without a TTL, by design), the channel a write announces its key on, the catalogue of
 * the rules that read them, and the log of changes made through the management service.
 */
export function liveConfigKeys(keyPrefix: string): { hash: string; channel: string; rules: string; changes: string } {
  return {
    hash: `${keyPrefix}:config`,
    channel: `${keyPrefix}:config:changed`,
    rules: `${keyPrefix}:config:rules`,
    changes: `${keyPrefix}:config:changes`,
  };
}

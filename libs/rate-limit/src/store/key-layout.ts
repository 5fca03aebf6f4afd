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

/**
 * `prefix:{identity}:rule:algorithm`, and the rule's block key beside it. The identity is the hash
 * tag, so all keys of one identity share a Cluster slot; the digest form starts with `#`, which no
 * plain identity contains, so two identities never share a key. The algorithm is part of the key so
 * that changing a rule's algorithm never reads state of another shape.
 */
export function rateLimitKeys(
  prefix: string,
  ruleName: string,
  identity: string | null,
  algorithm: RateLimitAlgorithmName,
): { key: string; blockKey: string; markerKey: string; pendingKey: string } {
  const base = `${prefix}:{${identityPart(identity)}}:${ruleName}`;
  return {
    key: `${base}:${ALGORITHM_TAG[algorithm]}`,
    blockKey: `${base}:block`,
    markerKey: `${base}:mark`,
    pendingKey: `${base}:pend`,
  };
}

import { createHash } from 'node:crypto';

/** Identities used in keys as they are: short, and nothing that could pick a Cluster slot (braces). */
const PLAIN_IDENTITY = /^[A-Za-z0-9._:-]{1,64}$/;

/**
 * `prefix:rule:identity`. An identity that is not short and plain is replaced by its SHA-256; the
 * digest form starts with `#`, which no plain identity contains, so two identities never share a key.
 */
export function rateLimitKey(prefix: string, ruleName: string, identity: string): string {
  const part = PLAIN_IDENTITY.test(identity)
    ? identity
    : `#${createHash('sha256').update(identity).digest('base64url')}`;
  return `${prefix}:${ruleName}:${part}`;
}

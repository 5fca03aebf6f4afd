import type { RateLimitAlgorithmName } from './algorithm.js';
import { FIXED_WINDOW_FIELDS, FIXED_WINDOW_REDIS_TYPE } from './fixed-window/fields.js';
import { GCRA_REDIS_TYPE } from './gcra/fields.js';
import { SLIDING_LOG_REDIS_TYPE } from './sliding-log/fields.js';
import { SLIDING_WINDOW_FIELDS, SLIDING_WINDOW_REDIS_TYPE } from './sliding-window/fields.js';
import { TOKEN_BUCKET_FIELDS, TOKEN_BUCKET_REDIS_TYPE } from './token-bucket/fields.js';

/**
 * The hash fields each algorithm stores at its state key in Redis, by meaningful name, so tools and
 * tests read state by name (`HGET key STORED_FIELDS['fixed-window'].count`) rather than by letter.
 * Only algorithms whose state is a hash are here: sliding-log keeps a sorted set and gcra a string.
 */
export const STORED_FIELDS = {
  'fixed-window': FIXED_WINDOW_FIELDS,
  'sliding-window': SLIDING_WINDOW_FIELDS,
  'token-bucket': TOKEN_BUCKET_FIELDS,
} as const satisfies Partial<Record<RateLimitAlgorithmName, Readonly<Record<string, string>>>>;

/** The Redis type of each algorithm's state key (what `TYPE key` answers). */
export const STORED_TYPES = {
  'fixed-window': FIXED_WINDOW_REDIS_TYPE,
  'sliding-window': SLIDING_WINDOW_REDIS_TYPE,
  'sliding-log': SLIDING_LOG_REDIS_TYPE,
  'token-bucket': TOKEN_BUCKET_REDIS_TYPE,
  gcra: GCRA_REDIS_TYPE,
} as const satisfies Record<RateLimitAlgorithmName, 'hash' | 'zset' | 'string'>;

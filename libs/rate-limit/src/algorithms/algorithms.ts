import type { RateLimitAlgorithm, RateLimitAlgorithmName } from './algorithm.js';
import { fixedWindow } from './fixed-window/fixed-window.js';
import { gcra } from './gcra/gcra.js';
import { slidingLog } from './sliding-log/sliding-log.js';
import { slidingWindow } from './sliding-window/sliding-window.js';
import { tokenBucket } from './token-bucket/token-bucket.js';

/** Every algorithm by name. */
export const ALGORITHMS: Readonly<Record<RateLimitAlgorithmName, RateLimitAlgorithm<unknown>>> = {
  'fixed-window': fixedWindow as RateLimitAlgorithm<unknown>,
  'sliding-window': slidingWindow as RateLimitAlgorithm<unknown>,
  'sliding-log': slidingLog as RateLimitAlgorithm<unknown>,
  'token-bucket': tokenBucket as RateLimitAlgorithm<unknown>,
  gcra: gcra as RateLimitAlgorithm<unknown>,
};

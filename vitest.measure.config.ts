import { defineConfig, mergeConfig } from 'vitest/config';
import base from './vitest.config.js';

/** Scenario measurements (bench/*.measure.ts): real servers, minutes long, printed as tables. */
export default mergeConfig(
  base,
  defineConfig({
    test: {
      include: ['bench/**/*.measure.ts'],
      reporters: ['default'],
      testTimeout: 300_000,
      hookTimeout: 60_000,
    },
  }),
);

import { defineConfig } from 'vitest/config';

/** The package's `exports` condition that points at its TypeScript sources: suites run on them, unbuilt. */
const SOURCE = 'nest-rate-limit-source';

export default defineConfig({
  resolve: { conditions: [SOURCE] },
  ssr: { resolve: { conditions: [SOURCE] } },
  test: {
    include: ['libs/**/*.spec.ts', 'test/**/*.spec.ts'],
    benchmark: { include: ['bench/**/*.bench.ts'] },
    // Each file starts its own redis-server processes; forks keep them apart and kill them with the file.
    pool: 'forks',
    globalSetup: ['./test/support/build.global.ts'],
    reporters: ['default', './test/support/plain-summary.reporter.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});

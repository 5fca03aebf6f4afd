import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  resolve: {
    alias: {
      '@app/rate-limit': fileURLToPath(new URL('./libs/rate-limit/src/index.ts', import.meta.url)),
    },
  },
  test: {
    include: ['libs/**/*.spec.ts', 'test/**/*.spec.ts'],
    benchmark: { include: ['bench/**/*.bench.ts'] },
    // Each file starts its own redis-server processes; forks keep them apart and kill them with the file.
    pool: 'forks',
    reporters: ['default', './test/support/plain-summary.reporter.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});

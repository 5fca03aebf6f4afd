import { join } from 'node:path';
import ts from 'typescript';
import { beforeAll, describe, expect, it } from 'vitest';
import { ROOT } from '../support/demo-process.js';

/**
 * Names (values and types together) each entry of the package exports. A ratchet: today's figures,
 * lowered as the public surface shrinks; never raised. A name moved from one entry to another
 * shows in both figures.
 */
const ENTRY_NAMES_BUDGETS = {
  // 0.3: an option's members are no names of their own (`RateLimitOptions['by']`), nor are the
  // exceptions' bodies (`getResponse()`); the store-error policy, the algorithms' names and Redis's
  // timeout error and options from the environment moved to the store entry. RateLimitExtension: the
  // type of `extensions`, what the wings' functions return.
  'libs/rate-limit/src/index.ts': 28,
  // 0.3: RateLimitRuleLimits is part of RateLimitLimitEntry. rateLimitManagement(): the extension
  // that adds RateLimitManagementService, made for every app before.
  'libs/rate-limit/src/live/index.ts': 16,
  // RateLimitKeyAudit: the key audit on demand, which was a member of RedisService. The extensions
  // rateLimitMetrics(), rateLimitHealth() and rateLimitKeyAudit(): the `metrics` option, and what every
  // app was given before.
  'libs/rate-limit/src/ops/index.ts': 12,
  // 0.3: RateLimitStoreErrorPolicy, RateLimitAlgorithmName, RedisTimeoutError and
  // redisOptionsFromEnv moved here from the main entry; RateLimitCircuitBreakerOptions is part of
  // RateLimitStoreErrorOptions.
  'libs/rate-limit/src/store/index.ts': 28,
} as const;

type Entry = keyof typeof ENTRY_NAMES_BUDGETS;
const ENTRIES = Object.keys(ENTRY_NAMES_BUDGETS) as Entry[];

/** Each entry's exported names, as the compiler sees them with the repository's tsconfig. */
function exportedNames(): Record<Entry, string[]> {
  const parsed = ts.getParsedCommandLineOfConfigFile(join(ROOT, 'tsconfig.json'), undefined, {
    ...ts.sys,
    onUnRecoverableConfigFileDiagnostic: (diagnostic) => {
      throw new Error(ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n'));
    },
  })!;
  const program = ts.createProgram(
    ENTRIES.map((entry) => join(ROOT, entry)),
    parsed.options,
  );
  const checker = program.getTypeChecker();
  return Object.fromEntries(
    ENTRIES.map((entry) => {
      const module = checker.getSymbolAtLocation(program.getSourceFile(join(ROOT, entry))!)!;
      return [entry, checker.getExportsOfModule(module).map(({ name }) => name)];
    }),
  ) as Record<Entry, string[]>;
}

describe('budget: names the entries export', () => {
  let names: Record<Entry, string[]>;

  beforeAll(() => {
    names = exportedNames();
  });

  it.each(ENTRIES)('%s exports at most its budget of names', (entry) => {
    const budget = ENTRY_NAMES_BUDGETS[entry];
    const sorted = [...names[entry]].sort();
    console.log(`${entry}: ${sorted.length} names (budget ${budget})\n  ${sorted.join('\n  ')}`);
    expect(sorted.length).toBeLessThanOrEqual(budget);
  });
});

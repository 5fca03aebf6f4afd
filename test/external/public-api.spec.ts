import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The public API is four entries: the front door (`nest-rate-limit`) and `/live`, `/ops` and
 * `/store`. Each exports the names listed here and no others, and every type that an exported
 * declaration's signature mentions is exported by one of them, so users can name what they are
 * handed. Checked on the declarations the package ships (built with its own tsconfig, `@internal`
 * members stripped), not on the sources.
 */

const PACKAGE = fileURLToPath(new URL('../../libs/rate-limit', import.meta.url));
const run = promisify(execFile);

/** Each entry's names: its `exports` subpath, and the declarations file it maps to in dist/. */
const ENTRIES: Record<string, { declarations: string; names: string[] }> = {
  'nest-rate-limit': {
    declarations: 'index.d.ts',
    names: [
      'ConditionalUnits',
      'RATE_LIMIT_DEFAULTS',
      'RateLimit',
      'RateLimitAllowList',
      'RateLimitBannedException',
      'RateLimitConfigurationError',
      'RateLimitException',
      'RateLimitExtension',
      'RateLimitGraphQLError',
      'RateLimitGuard',
      'RateLimitInspection',
      'RateLimitInterceptor',
      'RateLimitMode',
      'RateLimitModule',
      'RateLimitModuleAsyncOptions',
      'RateLimitModuleExtras',
      'RateLimitModuleOptions',
      'RateLimitNearLimitEvent',
      'RateLimitOptions',
      'RateLimitOutcome',
      'RateLimitRule',
      'RateLimitRuleRef',
      'RateLimitRequestDecision',
      'RateLimitWsError',
      'RateLimiterService',
      'ReservedUnits',
      'RuleDecision',
      'SkipRateLimit',
    ],
  },
  'nest-rate-limit/live': {
    declarations: 'live/index.d.ts',
    names: [
      'LiveConfigCentre',
      'LiveConfigState',
      'MemoryConfigCentre',
      'NestConfigCentre',
      'RateLimitBan',
      'RateLimitChange',
      'RateLimitChangeAuthor',
      'RateLimitConfigCentre',
      'RateLimitIdentityOverride',
      'RateLimitLimitEntry',
      'RateLimitManagementService',
      'RateLimitOverride',
      'RateLimitPermissionError',
      'RateLimitStoreUnavailableError',
      'RedisConfigCentre',
      'rateLimitManagement',
    ],
  },
  'nest-rate-limit/ops': {
    declarations: 'ops/index.d.ts',
    names: [
      'CircuitBreakerState',
      'KeyAuditReport',
      'RateLimitDecisionOutcome',
      'RateLimitHealth',
      'RateLimitHealthIndicator',
      'RateLimitKeyAudit',
      'RateLimitLoggingOptions',
      'RedisMemoryState',
      'SampledLogLevel',
      'rateLimitHealth',
      'rateLimitKeyAudit',
      'rateLimitMetrics',
    ],
  },
  'nest-rate-limit/store': {
    declarations: 'store/index.d.ts',
    names: [
      'ALGORITHM_NAMES',
      'LiftedKeysWatcher',
      'MemoryRateLimitStore',
      'RateLimitConsumption',
      'RateLimitDecision',
      'RateLimitFailoverOptions',
      'RateLimitHit',
      'RateLimitKeysBeside',
      'RateLimitReceipt',
      'RateLimitRedisOptions',
      'RateLimitRefund',
      'RateLimitSettlement',
      'RateLimitStanding',
      'RateLimitStore',
      'RateLimitStoreErrorOptions',
      'RateLimitStoreErrorPolicy',
      'RateLimitAlgorithmName',
      'RedisScript',
      'RedisService',
      'RedisTimeoutError',
      'redisOptionsFromEnv',
      'STORED_FIELDS',
      'STORED_TYPES',
      'keyIdOf',
      'keysBeside',
      'rateLimitKey',
      'rateLimitKeys',
      'ruleKeyId',
    ],
  },
};

describe('the public API', () => {
  let outDir: string;
  let checker: ts.TypeChecker;
  /** Per entry, the declarations it exports (aliases resolved). */
  const byEntry = new Map<string, Set<ts.Symbol>>();
  /** What any entry exports. */
  const exported = new Set<ts.Symbol>();

  beforeAll(async () => {
    outDir = mkdtempSync(join(tmpdir(), 'rl-api-'));
    await run(process.execPath, [
      join(PACKAGE, '../../node_modules/typescript/bin/tsc'),
      '-p',
      join(PACKAGE, 'tsconfig.build.json'),
      '--outDir',
      outDir,
      '--emitDeclarationOnly',
      '--sourceMap',
      'false',
    ]);
    const files = Object.values(ENTRIES).map(({ declarations }) => join(outDir, declarations));
    const program = ts.createProgram(files, {
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      noEmit: true,
    });
    checker = program.getTypeChecker();
    for (const [entry, { declarations }] of Object.entries(ENTRIES)) {
      const module = checker.getSymbolAtLocation(program.getSourceFile(join(outDir, declarations))!)!;
      const symbols = new Set(checker.getExportsOfModule(module).map((symbol) => resolved(symbol)));
      byEntry.set(entry, symbols);
      for (const symbol of symbols) exported.add(symbol);
    }
  }, 120_000);

  afterAll(() => {
    if (outDir) rmSync(outDir, { recursive: true, force: true });
  });

  const resolved = (symbol: ts.Symbol) =>
    symbol.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(symbol) : symbol;

  /** The package's own declarations that `node`'s type annotations refer to, by name. */
  function referencedDeclarations(node: ts.Node, found: Map<ts.Symbol, string>): void {
    if (ts.isTypeReferenceNode(node) || ts.isExpressionWithTypeArguments(node) || ts.isTypeQueryNode(node)) {
      const name = ts.isTypeReferenceNode(node)
        ? node.typeName
        : ts.isTypeQueryNode(node)
          ? node.exprName
          : node.expression;
      const symbol = checker.getSymbolAtLocation(name);
      if (symbol) {
        const target = resolved(symbol);
        const declared = target.declarations?.[0]?.getSourceFile().fileName ?? '';
        // Type parameters are the signature's own; everything from other packages is theirs to export.
        if (declared.startsWith(outDir) && !(target.flags & ts.SymbolFlags.TypeParameter)) {
          found.set(target, target.getName());
        }
      }
    }
    ts.forEachChild(node, (child) => referencedDeclarations(child, found));
  }

  it.each(Object.keys(ENTRIES))('%s exports the names it is meant to, and no others', (entry) => {
    const names = [...byEntry.get(entry)!].map((symbol) => symbol.getName());
    expect(names.sort()).toEqual([...ENTRIES[entry].names].sort());
  });

  it('exports every name from one entry only', () => {
    const all = Object.values(ENTRIES).flatMap(({ names }) => names);
    expect(all.filter((name, i) => all.indexOf(name) !== i)).toEqual([]);
  });

  it('exports every type its exported signatures mention, from one of its entries', () => {
    const missing: string[] = [];
    for (const symbol of exported) {
      const found = new Map<ts.Symbol, string>();
      for (const declaration of symbol.declarations ?? []) referencedDeclarations(declaration, found);
      for (const [target, name] of found) {
        if (!exported.has(target) && target !== symbol) missing.push(`${symbol.getName()} mentions ${name}`);
      }
    }
    expect(missing).toEqual([]);
  });

  it('keeps internals out: no store wrapper, problem log, registry or resolved options', () => {
    const names = [...exported].map((symbol) => symbol.getName());
    expect(names).toEqual(expect.arrayContaining(['RateLimitModule', 'RateLimit', 'RateLimiterService']));
    for (const internal of ['ResilientStore', 'StoreProblemLog', 'RateLimitRuleRegistry', 'ResolvedRateLimitOptions']) {
      expect(names).not.toContain(internal);
    }
  });

  it('every entry is in package.json `exports`, with its sources, declarations and JavaScript', () => {
    const manifest = JSON.parse(readFileSync(join(PACKAGE, 'package.json'), 'utf8')) as {
      exports: Record<string, unknown>;
    };
    for (const [entry, { declarations }] of Object.entries(ENTRIES)) {
      const subpath = `.${entry.slice('nest-rate-limit'.length)}`;
      const base = declarations.slice(0, -'.d.ts'.length);
      expect(manifest.exports[subpath], subpath).toEqual({
        'nest-rate-limit-source': `./src/${base}.ts`,
        types: `./dist/${base}.d.ts`,
        default: `./dist/${base}.js`,
      });
    }
  });
});

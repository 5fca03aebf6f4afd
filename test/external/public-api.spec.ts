import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The public API is one barrel: every type that an exported declaration's signature mentions is
 * exported too, so users can name what they are handed. Checked on the declarations the package
 * ships (built with its own tsconfig, `@internal` members stripped), not on the sources.
 */

const PACKAGE = fileURLToPath(new URL('../../libs/rate-limit', import.meta.url));
const run = promisify(execFile);

describe('the public API', () => {
  let outDir: string;
  let program: ts.Program;
  let checker: ts.TypeChecker;
  let exported: Set<ts.Symbol>;
  let entry: ts.SourceFile;

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
    program = ts.createProgram([join(outDir, 'index.d.ts')], {
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      noEmit: true,
    });
    checker = program.getTypeChecker();
    entry = program.getSourceFile(join(outDir, 'index.d.ts'))!;
    const module = checker.getSymbolAtLocation(entry)!;
    exported = new Set(checker.getExportsOfModule(module).map((symbol) => resolved(symbol)));
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

  it('exports every type its exported signatures mention', () => {
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
});

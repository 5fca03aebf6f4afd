/** Import rules checked in CI (`npm run lint:imports`). */

const SRC = '^libs/rate-limit/src/';

/**
 * The folders of the request path, top to bottom: http -> limiter -> resilience -> redis, store,
 * algorithms. A folder imports only folders below it; `module/` alone sees everything, as it composes
 * them. Each pattern also matches the name a folder may get in the layout change under way (`guard/`
 * for http/, `live/` for config-centre/ and management/, `ops/` for metrics/, health/ and audit/),
 * so the rules hold on both sides of it.
 */
// The guard, the interceptor, the 429 and headers, and what they read of each transport.
const HTTP = `${SRC}(http|transports|guard)/`;
const LIMITER = `${SRC}limiter/`;
const RESILIENCE = `${SRC}resilience/`;
// The stores that hold the counts, and the algorithms and scripts they run.
const STORES = `${SRC}(redis|store|algorithms)/`;
const REQUEST_PATH = `${SRC}(http|transports|guard|limiter|resilience|redis|store|algorithms)/`;
// Built on the request path, beside it, and shipped as entries of their own: live limits and operations.
const LIVE_AND_OPS = `${SRC}(config-centre|management|live|metrics|health|audit|ops)/`;

/**
 * A layer rule with exceptions that name both ends: `exceptions` are `[file, target]` pairs, a file
 * under `src/` and a pattern of the file it may import (matching its folder's old and new name), that
 * may stay until their owner moves them; any other import of the kind fails, from those files too.
 */
function layerRule({ name, comment, from, to, exceptions = [] }) {
  const exempt = [...new Set(exceptions.map(([file]) => file))];
  const anchored = (file) => `${SRC}${file.replace(/\./g, '\\.')}$`;
  const target = (pattern) => `${SRC}${pattern}$`;
  return [
    {
      name,
      severity: 'error',
      comment,
      from: { path: from, pathNot: exempt.map(anchored) },
      to: { path: to },
    },
    ...exempt.map((file) => ({
      name,
      severity: 'error',
      comment: `${comment} (${file}: only its listed exceptions)`,
      from: { path: anchored(file) },
      to: {
        path: to,
        pathNot: exceptions.filter(([source]) => source === file).map(([, pattern]) => target(pattern)),
      },
    })),
  ];
}

module.exports = {
  forbidden: [
    {
      name: 'optional-peers-loaded-where-used',
      severity: 'error',
      comment:
        'ioredis and @nestjs/config are optional peers: an app on the embedded store runs without them. ' +
        'Only the files that load them when configured (redis-connection.ts, app-config.ts) may import ' +
        'them at run time; everywhere else, types only.',
      from: { path: SRC, pathNot: ['redis/redis-connection\\.ts$', 'limiter/app-config\\.ts$', '\\.spec\\.ts$'] },
      to: { path: 'node_modules/(ioredis|@nestjs/config)/', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'A cycle means two files are one concept, or one of them sits at the wrong depth.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'library-imports-no-app-code',
      severity: 'error',
      comment: 'The package is published alone: it may not reach into the demo, the suites or the benchmarks.',
      from: { path: '^libs/rate-limit/(src|bin)' },
      to: { path: '^(apps|test|bench)/' },
    },
    ...layerRule({
      name: 'limiter-imports-no-guard',
      comment:
        'The limiter decides for any caller (the guard, consume() in a queue worker): it may not import ' +
        'the guard layer above it (http/, transports/, guard/).',
      from: LIMITER,
      to: HTTP,
    }),
    ...layerRule({
      name: 'resilience-imports-nothing-above',
      comment: 'resilience/ wraps a store: it may not import the limiter or the guard layer above it.',
      from: RESILIENCE,
      to: `${SRC}(http|transports|guard|limiter)/`,
    }),
    ...layerRule({
      name: 'stores-import-nothing-above',
      comment:
        'redis/, store/ and algorithms/ are the bottom of the request path: they may not import ' +
        'resilience/, the limiter or the guard layer.',
      from: STORES,
      to: `${SRC}(http|transports|guard|limiter|resilience)/`,
    }),
    {
      name: 'core-imports-no-wings',
      severity: 'error',
      comment:
        'Live limits (live/) and operations (ops/) are extensions an app adds to the module ' +
        '(`extensions: [rateLimitMetrics(), ...]`); the core, module/ included, offers seams they fill ' +
        '(module/extension.ts, the DECISION_OBSERVER token, limiter steps) and never imports them: an app ' +
        'that adds none loads none.',
      from: {
        path: `${SRC}(module|limiter|http|transports|guard|rules|store|redis|resilience|algorithms|logging|decorators)/`,
      },
      to: { path: `${SRC}(live|ops)/` },
    },
    ...layerRule({
      name: 'request-path-imports-no-live-or-ops',
      comment:
        'Live limits (config centres, management) and operations (metrics, health, the key audit) are ' +
        'built on the request path and shipped as their own entries; the request path may not import ' +
        'them, or every app would load them.',
      from: `${REQUEST_PATH}|${SRC}(rules|decorators|logging)/`,
      to: LIVE_AND_OPS,
      exceptions: [],
    }),
    {
      name: 'only-entries-import-module',
      severity: 'error',
      comment:
        'module/ composes every layer, so nothing but it and the entries (index.ts, live/ and ops/ ' +
        "index.ts, the CLIs of package.json's bin) imports it. Except its leaves, a shared bottom " +
        'layer every folder may read: options.ts (the option types and RESOLVED_RATE_LIMIT_OPTIONS, which ' +
        'services inject; it imports only types), defaults.ts (every default and internal constant) and ' +
        'extension.ts (the shape of an extension, which live/ and ops/ make).',
      from: {
        path: SRC,
        pathNot: [`${SRC}module/`, `${SRC}((live|ops)/)?index\\.ts$`, '\\.cli\\.ts$'],
      },
      to: { path: `${SRC}module/`, pathNot: `${SRC}module/(options|defaults|extension)\\.ts$` },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { conditionNames: ['nest-rate-limit-source', 'import', 'default'] },
  },
};

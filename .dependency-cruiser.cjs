/** Import rules checked in CI (`npm run lint:imports`). */
module.exports = {
  forbidden: [
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
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { conditionNames: ['nest-rate-limit-source', 'import', 'default'] },
  },
};

import type { ExecutionContext } from '@nestjs/common';
import type { LimitedRequest } from './limited-request.js';
import { afterEach, describe, expect, it } from 'vitest';
import { ExemptionProblems, skips } from './exemptions.js';

const context: LimitedRequest = {
  address: undefined,
  gone: () => false,
  userAgent: () => undefined,
  onGone: () => () => undefined,
  context: {} as ExecutionContext,
};

/** A thenable that is not a native promise, as a query builder's or another promise library's. */
const thenable = (value: unknown) => ({
  // oxlint-disable-next-line unicorn/no-thenable -- a thenable is what this test is about
  then: (resolve: (value: unknown) => unknown) => resolve(value),
});

describe('skips', () => {
  const problems = new ExemptionProblems();
  afterEach(() => problems.close());

  it("decides by a thenable's answer, not by the thenable itself (an object, truthy)", async () => {
    expect(await skips(() => thenable(false) as never, context, 'rule r', problems)).toBe(false);
    expect(await skips(() => thenable(true) as never, context, 'rule r', problems)).toBe(true);
  });

  it('a thenable that rejects skips nothing (fail closed)', async () => {
    // oxlint-disable-next-line unicorn/no-thenable -- a thenable is what this test is about
    const rejecting = { then: (_: unknown, reject: (error: unknown) => unknown) => reject(new Error('no')) };
    expect(await skips(() => rejecting as never, context, 'rule r', problems)).toBe(false);
  });
});

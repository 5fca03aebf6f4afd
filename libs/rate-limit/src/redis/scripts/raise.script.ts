import { ScriptsByAlgorithms } from '../script-runner.js';
import { defineScriptLayout } from '../script-protocol.js';
import type { RateLimitHit } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, algorithmArgs, algorithmsLua } from './shared.lua.js';

/**
 * The call and reply of RAISE_SCRIPTS: one rule's state key and algorithm arguments, the time the
 * figure was seen at (Redis's, or the given `now`'s), the start of a fixed window, the figure, and a
 * sliding log's own admissions (`time:nonce:cost`, comma-separated).
 */
export const RAISE_LAYOUT = defineScriptLayout('raise', {
  head: {
    keys: ['key'],
    args: { ...ALGORITHM_ARGS, now: 'number', start: 'number', figure: 'number', admissions: 'string' },
  },
  reply: { head: { raised: 'flag' } },
});

/**
 * Lost-write repair: raises a rule's state to at least what an instance saw in it, after Redis
 * reported less (writes lost in a failover). "At least", so instances repairing at once never add
 * up. Each algorithm's `raise` in its Lua says what "at least" means for its state: a fixed window's
 * count (that window only, by its start), a token bucket's tokens, a GCRA arrival time, a sliding
 * window's estimate, a sliding log's own admissions put back.
 */
export const RAISE_SCRIPTS = new ScriptsByAlgorithms(
  RAISE_LAYOUT.name,
  (algorithms) => `${algorithmsLua(algorithms)}
${RAISE_LAYOUT.lua}
local call = readHead()
return replyHead({ raised = ALG[call.alg].raise(call.key, call.now, call) })
`,
);

/** One raise: a rule's state to at least `figure` units used at `at`. */
export interface LostWriteRaise {
  hit: RateLimitHit;
  /** When the figure held (Redis's time of the decision that showed the loss, or the given `now`). */
  at: number;
  /** A fixed window's start (on the same clock); the others ignore it. */
  windowStart: number;
  figure: number;
  /** A sliding log's: this instance's admissions still in the window, to put back. */
  admissions?: readonly { at: number; nonce: string; cost: number }[];
}

export function encodeRaise({ hit, at, windowStart, figure, admissions }: LostWriteRaise) {
  return RAISE_LAYOUT.encode({
    key: hit.key,
    ...algorithmArgs(hit),
    now: at,
    start: windowStart,
    figure,
    admissions: (admissions ?? []).map(({ at: time, nonce, cost }) => `${time}:${nonce}:${cost}`).join(','),
  });
}

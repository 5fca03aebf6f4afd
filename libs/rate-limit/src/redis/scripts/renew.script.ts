import { ScriptsByAlgorithms } from '../script-runner.js';
import { defineScriptLayout } from '../script-protocol.js';
import type { RateLimitRefund } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, algorithmArgs, algorithmsLua } from './shared.lua.js';

/**
 * The call and reply of RENEW_SCRIPTS: one slot's state key and algorithm arguments, the time and
 * nonce of its admission (as its receipt has them), and the time to date it (negative: Redis's).
 * Reply: the time it holds now, or -1 when the key no longer holds it.
 */
export const RENEW_LAYOUT = defineScriptLayout('renew', {
  head: {
    keys: ['key'],
    args: { ...ALGORITHM_ARGS, at: 'number', nonce: 'string', now: 'number' },
  },
  reply: { head: { renewed: 'number' } },
});

/**
 * Keeps a `concurrency` cap's slot taken while its request runs: its admission dated now, counting
 * nothing (`renew` in its algorithm's Lua; a cap is a sliding log). One call per slot, a few per
 * instance every `SLOT_LEASE_MS / 3`: nothing on a request's path.
 */
export const RENEW_SCRIPTS = new ScriptsByAlgorithms(
  RENEW_LAYOUT.name,
  (algorithms) => `${algorithmsLua(algorithms)}
${RENEW_LAYOUT.lua}
local call = readHead()
return replyHead({ renewed = ALG[call.alg].renew(call.key, call.at, call, call.nonce, callTime(call.now)) })
`,
);

/** One renewal: a slot's admission (its receipt), dated `now` (undefined: Redis's clock). */
export function encodeRenew({ hit, receipt }: RateLimitRefund, now: number | undefined) {
  return RENEW_LAYOUT.encode({
    key: hit.key,
    ...algorithmArgs(hit),
    at: receipt.admittedAt,
    nonce: receipt.nonce,
    now: now ?? -1,
  });
}

/** The time a renewed slot holds, or undefined when it is gone. */
export function decodeRenew(reply: unknown): number | undefined {
  const { renewed } = RENEW_LAYOUT.decode(reply).head;
  return renewed >= 0 ? renewed : undefined;
}

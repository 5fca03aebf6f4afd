import { ScriptsByAlgorithms } from '../script-runner.js';
import { defineScriptLayout } from '../script-protocol.js';
import { keysBeside } from '../../store/key-layout.js';
import type { RateLimitSettlement } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, algorithmArgs, algorithmsLua } from './shared.lua.js';

/**
 * The call and reply of REFUND_SCRIPT.
 *
 * KEYS per rule: its state key and its pending key.
 * ARGV: the `now` that the consume script returned, its nonce, then per rule: the algorithm, limit,
 * window ms, cost, burst, `refund` to take the units back, for a fixed window on Redis's clock
 * the start of the admission's window (on Redis's clock; -1 for any other), and the units its
 * member in the pending key holds (a `countOn` admission's cost, a `settleCost` one's overdraft).
 * Reply: the number of rules settled.
 */
export const REFUND_LAYOUT = defineScriptLayout('refund', {
  head: { args: { at: 'number', nonce: 'string' } },
  rule: {
    keys: ['key', 'pendingKey'],
    args: {
      ...ALGORITHM_ARGS,
      refund: 'flag',
      start: 'number',
      pending: 'number',
    },
  },
  reply: { head: { settled: 'number' } },
});

/**
 * Ends admissions of one consume call (`FIXED_WINDOW_FAST_SCRIPT` or `CONSUME_SCRIPTS`): the response
 * settled (a `countOn` or `settleCost` rule's admission is no longer in flight) and, where asked, the units are
 * taken back: for refunds (`countOn`), and on Cluster for the slots that admitted a request
 * another slot rejected.
 */
export const REFUND_SCRIPTS = new ScriptsByAlgorithms(
  REFUND_LAYOUT.name,
  (algorithms) => `${algorithmsLua(algorithms)}
${REFUND_LAYOUT.lua}
local call = readHead()
for i = 1, call.rules do
  local p = readRule(i)
  read('ZREM', p.pendingKey, pendingMember(call.nonce, p.pending))
  if p.refund then ALG[p.alg].refund(p.key, call.at, p, call.nonce) end
end
return replyHead({ settled = call.rules })
`,
);

/** One REFUND_SCRIPT call: settlements of one slot and one admission (`admittedAt`, nonce). */
export function encodeRefund(
  admittedAt: number,
  nonce: string,
  settlements: readonly RateLimitSettlement[],
): { keys: string[]; args: (string | number)[] } {
  return REFUND_LAYOUT.encode(
    { at: admittedAt, nonce },
    settlements.map(({ hit, refund, receipt }) => ({
      key: hit.key,
      pendingKey: keysBeside(hit.key).pendingKey,
      ...algorithmArgs(hit),
      refund,
      start: receipt.windowStart ?? -1,
      pending: hit.overdraftBound ?? hit.cost,
    })),
  );
}

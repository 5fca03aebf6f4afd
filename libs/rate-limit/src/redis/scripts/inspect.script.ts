import { markerFrom } from '../failover/lost-write-marker.js';
import { ScriptsByAlgorithms } from '../script-runner.js';
import { defineScriptLayout } from '../script-protocol.js';
import { keysBeside } from '../../store/key-layout.js';
import type { RateLimitHit } from '../../store/rate-limit-store.js';
import { ALGORITHM_ARGS, algorithmArgs, algorithmsLua } from './shared.lua.js';

/**
 * The call and reply of INSPECT_SCRIPTS.
 *
 * KEYS per rule: its state key, its block key and its marker key. ARGV: now in ms (negative: Redis
 * TIME), then per rule the algorithm's args (with cost 0), the block ms and the marker's count.
 * Reply: now, then per rule the units left, ms until the full limit is back, and ms the penalty has left.
 */
export const INSPECT_LAYOUT = defineScriptLayout('inspect', {
  head: { args: { now: 'number' } },
  rule: { keys: ['key', 'blockKey', 'markerKey'], args: { ...ALGORITHM_ARGS, block: 'number', markFrom: 'number' } },
  reply: { head: { now: 'number' }, rule: { remaining: 'number', reset: 'number', blocked: 'number' } },
});

/**
 * Reads rules' state as a request of cost 0 would find it, and writes nothing of its own: only the
 * repairs every read makes (a key without a TTL gets one, junk is dropped), as consume would.
 */
export const INSPECT_SCRIPTS = new ScriptsByAlgorithms(
  INSPECT_LAYOUT.name,
  (algorithms) => `${algorithmsLua(algorithms)}
${INSPECT_LAYOUT.lua}
local call = readHead()
local now = callTime(call.now)
local out = replyHead({ now = now })
for i = 1, call.rules do
  local p = readRule(i)
  local s = ALG[p.alg].check(p.key, now, p)
  local blocked = 0
  if p.block > 0 then
    local ends = num(read('GET', p.blockKey))
    if ends and ends > now then blocked = ends - now end
  end
  pushRule(out, { remaining = s.remaining, reset = s.reset or 0, blocked = blocked })
end
return out
`,
);

export function encodeInspect(
  hits: readonly RateLimitHit[],
  now: number | undefined,
  markerShare: number | false,
): { keys: string[]; args: (string | number)[] } {
  return INSPECT_LAYOUT.encode(
    { now: now ?? -1 },
    hits.map((hit) => {
      const { blockKey, markerKey } = keysBeside(hit.key);
      return {
        key: hit.key,
        blockKey,
        markerKey,
        ...algorithmArgs({ ...hit, cost: 0 }),
        block: hit.blockMs,
        markFrom: markerFrom(markerShare, hit),
      };
    }),
  );
}

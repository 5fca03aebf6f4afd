/**
 * The TypeScript side of a script layout: named values to a call's KEYS and ARGV, and a reply's
 * flat array back to named values, walking the declaration as the generated Lua does
 * (`script-layout-lua.ts`); and the two converse directions, what the Lua reads of a call and the
 * reply it builds, for tests and tools. A reply that does not fit the layout fails here, rather than
 * be read as its neighbours.
 */
import type {
  ArgKind,
  HeadInput,
  HeadReply,
  LayoutDeclaration,
  LayoutFields,
  ReplyKind,
  RuleInput,
  RuleReply,
  ScriptLayout,
} from './script-layout.js';

/** The encoders and decoders of a layout, for `defineScriptLayout`. */
export type LayoutCodec<D extends LayoutDeclaration> = Pick<
  ScriptLayout<D>,
  'encode' | 'decodeCall' | 'encodeReply' | 'decode'
>;

function encodeArg(kind: ArgKind, value: unknown): string | number {
  if (kind === 'flag') return value ? 1 : 0;
  return value as string | number;
}

/** A value as it comes back: ARGV entries and bulk replies as strings, integer replies as numbers. */
function decodeValue(kind: ArgKind, raw: unknown): unknown {
  if (kind === 'flag') return String(raw) === '1';
  if (kind === 'number') return Number(raw);
  return String(raw);
}

function decodeFields(fields: readonly [string, ReplyKind][], values: readonly unknown[], from: number) {
  const out: Record<string, unknown> = {};
  fields.forEach(([name, kind], i) => {
    const raw = values[from + i];
    if (typeof kind === 'object') {
      const packed = Number(raw);
      kind.bits.forEach((bit, b) => (out[bit] = (packed & (2 ** b)) !== 0));
    } else {
      out[name] = decodeValue(kind, raw);
    }
  });
  return out;
}

/** As the Lua pushes a reply field: flags as 1 or 0, bits summed. */
function encodeReplyField(kind: ReplyKind, values: Record<string, unknown>, name: string): string | number {
  if (typeof kind === 'object') return kind.bits.reduce((sum, bit, b) => sum + (values[bit] ? 2 ** b : 0), 0);
  return encodeArg(kind, values[name]);
}

/** The encoders and decoders of the layout `name` (for messages), laid out as `layout` says. */
export function layoutCodec<D extends LayoutDeclaration>(name: string, layout: LayoutFields): LayoutCodec<D> {
  const { headKeys, headArgs, hasRules, ruleKeys, ruleArgs, headArgCount, replyHead, replyRule } = layout;
  return {
    encode(head, rules = []) {
      const h = head as Record<string, unknown>;
      const keys = headKeys.map((key) => h[key] as string);
      const args = headArgs.map(([arg, kind]) => encodeArg(kind, h[arg]));
      if (hasRules) args.push(rules.length);
      for (const rule of rules as readonly Record<string, unknown>[]) {
        for (const key of ruleKeys) keys.push(rule[key] as string);
        for (const [arg, kind] of ruleArgs) args.push(encodeArg(kind, rule[arg]));
      }
      return { keys, args };
    },
    decodeCall({ keys, args }) {
      const rules = hasRules ? Number(args[headArgs.length]) : 0;
      if (
        !Number.isInteger(rules) ||
        keys.length !== headKeys.length + rules * ruleKeys.length ||
        args.length !== headArgCount + rules * ruleArgs.length
      ) {
        throw new Error(`A ${name} call of ${keys.length} keys and ${args.length} args does not fit its layout`);
      }
      const part = (names: readonly string[], fields: readonly [string, ArgKind][], k: number, a: number) => {
        const out: Record<string, unknown> = {};
        names.forEach((key, i) => (out[key] = keys[k + i]));
        fields.forEach(([arg, kind], i) => (out[arg] = decodeValue(kind, args[a + i])));
        return out;
      };
      return {
        head: part(headKeys, headArgs, 0, 0) as HeadInput<D>,
        rules: Array.from(
          { length: rules },
          (_, i) =>
            part(
              ruleKeys,
              ruleArgs,
              headKeys.length + i * ruleKeys.length,
              headArgCount + i * ruleArgs.length,
            ) as RuleInput<D>,
        ),
      };
    },
    encodeReply(head, rules = []) {
      const h = head as Record<string, unknown>;
      const out = replyHead.map(([field, kind]) => encodeReplyField(kind, h, field));
      for (const rule of rules as readonly Record<string, unknown>[]) {
        for (const [field, kind] of replyRule) out.push(encodeReplyField(kind, rule, field));
      }
      return out;
    },
    decode(reply, expected) {
      // A reply of the wrong length means both sides no longer share this layout (or a Lua value
      // was nil, which ends a Redis array early): decoding it would read values as their neighbours.
      if (!Array.isArray(reply)) throw new Error(`The ${name} script replied ${typeof reply}, not an array`);
      const rest = reply.length - replyHead.length;
      const count = replyRule.length === 0 ? 0 : rest / replyRule.length;
      const fits = replyRule.length === 0 ? rest === 0 : Number.isInteger(count) && count >= 0;
      if (!fits || (expected !== undefined && replyRule.length > 0 && count !== expected)) {
        throw new Error(
          `The ${name} script replied ${reply.length} values, not ${replyHead.length} + ` +
            `${replyRule.length} per rule${expected === undefined ? '' : ` for ${expected} rules`}`,
        );
      }
      return {
        head: decodeFields(replyHead, reply, 0) as HeadReply<D>,
        rules: Array.from(
          { length: count },
          (_, i) => decodeFields(replyRule, reply, replyHead.length + i * replyRule.length) as RuleReply<D>,
        ),
      };
    },
  };
}

/**
 * What a script's layout declaration is written in, and what the layout built from it gives: the
 * vocabulary of `defineScriptLayout` (`script-protocol.ts`, which says how a call and a reply are
 * laid out). The types that name a call's and a reply's values after the declaration are here, so
 * that the encoder, the decoder and their callers share one spelling of every field; and the
 * declaration as ordered lists (`layoutFields`), which the Lua side (`script-layout-lua.ts`) and the
 * TypeScript side (`script-layout-codec.ts`) both walk, so they cannot walk it differently.
 */

/**
 * How a value crosses the boundary. `string` goes as it is; `number` as a number (read in Lua with
 * `tonumber`); `flag` is a boolean sent as 1 or 0 (in Lua, `ARGV[i] == '1'`, and a reply flag is any
 * truthy value).
 */
export type ArgKind = 'string' | 'number' | 'flag';

/** A reply field that packs named booleans into one integer: the first name is bit 1, the next 2, then 4. */
export interface BitsKind<Name extends string = string> {
  readonly bits: readonly Name[];
}

export type ReplyKind = ArgKind | BitsKind;

/** Named booleans packed into one reply integer (see `BitsKind`). */
export function bits<const Name extends string>(...names: Name[]): BitsKind<Name> {
  return { bits: names };
}

export type ArgFields = Readonly<Record<string, ArgKind>>;
export type ReplyFields = Readonly<Record<string, ReplyKind>>;

/** The keys and args of the call's head, or of one rule. */
export interface LayoutPart {
  readonly keys?: readonly string[];
  readonly args?: ArgFields;
}

export interface LayoutDeclaration {
  readonly head?: LayoutPart;
  /** Present when the call carries a list of rules, each laid out alike. */
  readonly rule?: LayoutPart;
  readonly reply?: { readonly head?: ReplyFields; readonly rule?: ReplyFields };
}

/** The name the rule count is read under in Lua, in the head's table. */
export const RULE_COUNT = 'rules';

type Get<T, K extends PropertyKey> = K extends keyof T ? Exclude<T[K], undefined> : undefined;
type Flat<T> = { [K in keyof T]: T[K] } & {};

type Value<K> = K extends 'string' ? string : K extends 'number' ? number : K extends 'flag' ? boolean : never;
type KeyValues<P> = Get<P, 'keys'> extends readonly (infer Name extends string)[] ? { [N in Name]: string } : {};
type ArgValues<P> = Get<P, 'args'> extends infer A extends ArgFields ? { -readonly [N in keyof A]: Value<A[N]> } : {};
type BitNames<F> = { [N in keyof F]: F[N] extends BitsKind<infer B> ? B : never }[keyof F];
type ReplyValues<F> = F extends ReplyFields
  ? Flat<
      { -readonly [N in keyof F as F[N] extends BitsKind ? never : N]: Value<F[N]> } & { [N in BitNames<F>]: boolean }
    >
  : {};

/** What the encoder takes for the head: its keys and args by name. */
export type HeadInput<D extends LayoutDeclaration> = Flat<KeyValues<Get<D, 'head'>> & ArgValues<Get<D, 'head'>>>;
/** What the encoder takes for one rule: its keys and args by name. */
export type RuleInput<D extends LayoutDeclaration> = Flat<KeyValues<Get<D, 'rule'>> & ArgValues<Get<D, 'rule'>>>;
export type HeadReply<D extends LayoutDeclaration> = ReplyValues<Get<Get<D, 'reply'>, 'head'>>;
export type RuleReply<D extends LayoutDeclaration> = ReplyValues<Get<Get<D, 'reply'>, 'rule'>>;

export interface EncodedCall {
  keys: string[];
  args: (string | number)[];
}

export interface DecodedCall<D extends LayoutDeclaration> {
  head: HeadInput<D>;
  rules: RuleInput<D>[];
}

export interface DecodedReply<D extends LayoutDeclaration> {
  head: HeadReply<D>;
  rules: RuleReply<D>[];
}

export interface ScriptLayout<D extends LayoutDeclaration> {
  readonly name: string;
  readonly declaration: D;
  /** Named values to the call's KEYS and ARGV. */
  encode(head: HeadInput<D>, rules?: readonly RuleInput<D>[]): EncodedCall;
  /**
   * The script's reply to named values.
   * @param rules the number of rules the reply must hold, when the caller knows it.
   */
  decode(reply: unknown, rules?: number): DecodedReply<D>;
  /** What the Lua's `readHead` and `readRule` read from a call, in TypeScript: for tests and tools. */
  decodeCall(call: EncodedCall): DecodedCall<D>;
  /** The reply the Lua's `replyHead` and `pushRule` build, in TypeScript: for tests and tools. */
  encodeReply(head: HeadReply<D>, rules?: readonly RuleReply<D>[]): (string | number)[];
  /**
   * Lua local functions for the script: `readHead()` returns the head's keys and args (and the rule
   * count as `rules`) as a table by name, `readRule(i)` the i-th rule's (from 1), `replyHead(t)`
   * starts the reply from a table with the head reply fields, and `pushRule(out, t)` appends a
   * rule's. Only those the layout has are defined.
   */
  readonly lua: string;
}

/** A declaration as ordered lists, each in the order its fields are declared. */
export interface LayoutFields {
  readonly headKeys: readonly string[];
  readonly headArgs: readonly [string, ArgKind][];
  /** Whether the call carries a list of rules (and so the rule count, after the head args). */
  readonly hasRules: boolean;
  readonly ruleKeys: readonly string[];
  readonly ruleArgs: readonly [string, ArgKind][];
  /** ARGV entries before the first rule's: the head args, and the rule count when there are rules. */
  readonly headArgCount: number;
  readonly replyHead: readonly [string, ReplyKind][];
  readonly replyRule: readonly [string, ReplyKind][];
}

export function layoutFields(declaration: LayoutDeclaration): LayoutFields {
  const headArgs = Object.entries(declaration.head?.args ?? {});
  const hasRules = declaration.rule !== undefined;
  return {
    headKeys: declaration.head?.keys ?? [],
    headArgs,
    hasRules,
    ruleKeys: declaration.rule?.keys ?? [],
    ruleArgs: Object.entries(declaration.rule?.args ?? {}),
    headArgCount: headArgs.length + (hasRules ? 1 : 0),
    replyHead: Object.entries(declaration.reply?.head ?? {}),
    replyRule: Object.entries(declaration.reply?.rule ?? {}),
  };
}

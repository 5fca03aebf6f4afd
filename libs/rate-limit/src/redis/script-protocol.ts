/**
 * The positional protocol between TypeScript and a Lua script, declared once by name.
 *
 * Redis passes a script only two flat arrays, KEYS and ARGV, and takes back one flat array. A script
 * whose call carries several rules lays each rule's values out at fixed offsets, so the encoder, the
 * Lua that reads the arrays and the decoder must agree on every position. Written by hand in three
 * places they drift apart silently (a value read as its neighbour). Here the layout is declared once,
 * and the TS encoder, the TS decoder and the Lua that reads the call and writes the reply are all
 * derived from it, with the same field names on both sides.
 *
 * Layout of a call: KEYS are the head keys, then each rule's keys. ARGV are the head args, then the
 * number of rules (only when the layout has a rule part, read in Lua as `rules`), then each rule's
 * args. The reply is the head reply fields, then each rule's reply fields. Fields keep the order in
 * which they are declared.
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

/** Lua's reserved words, which cannot be table keys written as `name = ...`. */
const LUA_KEYWORDS = new Set(
  `and break do else elseif end false for function goto if in local
   nil not or repeat return then true until while`.split(/\s+/),
);

/** Names become Lua table keys written as `name = ...`, so they must be plain identifiers. */
function checkName(layout: string, name: string): void {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name) || LUA_KEYWORDS.has(name)) {
    throw new Error(`Script layout ${layout}: ${JSON.stringify(name)} is not a Lua identifier`);
  }
}

function checkDistinct(layout: string, where: string, names: readonly string[]): void {
  for (const name of names) checkName(layout, name);
  const twice = names.find((name, i) => names.indexOf(name) !== i);
  if (twice !== undefined) throw new Error(`Script layout ${layout}: ${where} has ${twice} twice`);
}

/** A quoted Lua string for a value known to be plain (letters, digits, a few marks). */
function luaString(value: string): string {
  if (!/^[A-Za-z0-9_.:-]*$/.test(value)) throw new Error(`Not a plain Lua string: ${JSON.stringify(value)}`);
  return `'${value}'`;
}

/** A Lua table literal of plain strings by name: `{ start = 's', count = 'c' }`. */
export function luaStringTable(table: Readonly<Record<string, string>>): string {
  const entries = Object.entries(table).map(([name, value]) => {
    checkName('table', name);
    return `${name} = ${luaString(value)}`;
  });
  return `{ ${entries.join(', ')} }`;
}

function readArg(kind: ArgKind, at: string): string {
  if (kind === 'number') return `tonumber(ARGV[${at}])`;
  if (kind === 'flag') return `ARGV[${at}] == '1'`;
  return `ARGV[${at}]`;
}

function replyValue(kind: ReplyKind, table: string, name: string): string {
  if (typeof kind === 'object') {
    return kind.bits.map((bit, i) => `(${table}.${bit} and ${2 ** i} or 0)`).join(' + ');
  }
  if (kind === 'flag') return `(${table}.${name} and 1 or 0)`;
  return `${table}.${name}`;
}

/** A Lua table constructor of `name = value` entries, one a line (inside a function's body). */
function luaTable(entries: readonly string[]): string {
  return entries.length === 0 ? '{}' : `{\n${entries.map((entry) => `    ${entry},`).join('\n')}\n  }`;
}

/** Lua for where rule `i`'s entries start: after `head` entries and `i - 1` rules of `perRule`. */
function offset(head: number, perRule: number): string {
  return head === 0 ? `(i - 1) * ${perRule}` : `${head} + (i - 1) * ${perRule}`;
}

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

function replyNames(fields: readonly [string, ReplyKind][]): string[] {
  return fields.flatMap(([name, kind]) => (typeof kind === 'object' ? [...kind.bits] : [name]));
}

/** Declares a script's layout; `name` is for messages (and may be the script's own). */
export function defineScriptLayout<const D extends LayoutDeclaration>(name: string, declaration: D): ScriptLayout<D> {
  const headKeys = declaration.head?.keys ?? [];
  const headArgs = Object.entries(declaration.head?.args ?? {});
  const hasRules = declaration.rule !== undefined;
  const ruleKeys = declaration.rule?.keys ?? [];
  const ruleArgs = Object.entries(declaration.rule?.args ?? {});
  const replyHead = Object.entries(declaration.reply?.head ?? {});
  const replyRule = Object.entries(declaration.reply?.rule ?? {});

  checkDistinct(name, 'the head', [...headKeys, ...headArgs.map(([n]) => n), ...(hasRules ? [RULE_COUNT] : [])]);
  checkDistinct(name, 'a rule', [...ruleKeys, ...ruleArgs.map(([n]) => n)]);
  checkDistinct(name, 'the head reply', replyNames(replyHead));
  checkDistinct(name, 'a rule reply', replyNames(replyRule));
  if (!hasRules && replyRule.length > 0) throw new Error(`Script layout ${name}: a rule reply without rules`);

  const headArgCount = headArgs.length + (hasRules ? 1 : 0);

  const lua: string[] = [
    `-- The ${name} script's call and reply, generated from its layout declaration: ` +
      (hasRules
        ? `KEYS ${headKeys.length} + ${ruleKeys.length} per rule, ARGV ${headArgCount} + ${ruleArgs.length} per rule.`
        : `KEYS ${headKeys.length}, ARGV ${headArgCount}.`),
  ];
  const headFields = [
    ...headKeys.map((key, i) => `${key} = KEYS[${i + 1}]`),
    ...headArgs.map(([arg, kind], i) => `${arg} = ${readArg(kind, String(i + 1))}`),
    ...(hasRules ? [`${RULE_COUNT} = tonumber(ARGV[${headArgCount}])`] : []),
  ];
  lua.push(`local function readHead()\n  return ${luaTable(headFields)}\nend`);
  if (hasRules) {
    const ruleFields = [
      ...ruleKeys.map((key, i) => `${key} = KEYS[k + ${i + 1}]`),
      ...ruleArgs.map(([arg, kind], i) => `${arg} = ${readArg(kind, `a + ${i + 1}`)}`),
    ];
    lua.push(
      `local function readRule(i)\n` +
        `  local k, a = ${offset(headKeys.length, ruleKeys.length)}, ${offset(headArgCount, ruleArgs.length)}\n` +
        `  return ${luaTable(ruleFields)}\n` +
        `end`,
    );
  }
  if (replyHead.length > 0) {
    const values = replyHead.map(([field, kind]) => replyValue(kind, 't', field));
    lua.push(`local function replyHead(t)\n  return { ${values.join(', ')} }\nend`);
  }
  if (replyRule.length > 0) {
    const pushes = replyRule.map(([field, kind]) => `  out[#out + 1] = ${replyValue(kind, 't', field)}`);
    lua.push(`local function pushRule(out, t)\n${pushes.join('\n')}\nend`);
  }

  return {
    name,
    declaration,
    lua: `\n${lua.join('\n')}\n`,
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

/**
 * The Lua side of a script layout: the local functions a script reads its call and writes its reply
 * with (`readHead`, `readRule`, `replyHead`, `pushRule`), generated from the layout's declaration
 * so that they read every position the TypeScript encoder writes (`script-layout-codec.ts`); and
 * what any Lua written from TypeScript keeps to (names that are Lua identifiers, plain quoted
 * strings), which `luaStringTable` keeps for the algorithms' tables of stored fields too.
 */
import { type ArgKind, type LayoutFields, type ReplyKind, RULE_COUNT } from './script-layout.js';

/** Lua's reserved words, which cannot be table keys written as `name = ...`. */
const LUA_KEYWORDS = new Set(
  `and break do else elseif end false for function goto if in local
   nil not or repeat return then true until while`.split(/\s+/),
);

/** Names become Lua table keys written as `name = ...`, so they must be plain identifiers. */
export function checkLuaName(layout: string, name: string): void {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name) || LUA_KEYWORDS.has(name)) {
    throw new Error(`Script layout ${layout}: ${JSON.stringify(name)} is not a Lua identifier`);
  }
}

/** A quoted Lua string for a value known to be plain (letters, digits, a few marks). */
function luaString(value: string): string {
  if (!/^[A-Za-z0-9_.:-]*$/.test(value)) throw new Error(`Not a plain Lua string: ${JSON.stringify(value)}`);
  return `'${value}'`;
}

/** A Lua table literal of plain strings by name: `{ start = 's', count = 'c' }`. */
export function luaStringTable(table: Readonly<Record<string, string>>): string {
  const entries = Object.entries(table).map(([name, value]) => {
    checkLuaName('table', name);
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

/** The Lua local functions of a layout (`ScriptLayout.lua`), named `name` in their comment. */
export function layoutLua(name: string, layout: LayoutFields): string {
  const { headKeys, headArgs, hasRules, ruleKeys, ruleArgs, headArgCount, replyHead, replyRule } = layout;
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
  return `\n${lua.join('\n')}\n`;
}

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
 *
 * This file checks a declaration and builds its layout; what a declaration is written in is
 * `script-layout.ts`, the Lua side `script-layout-lua.ts`, the TypeScript side `script-layout-codec.ts`.
 */
import { layoutCodec } from './script-layout-codec.js';
import { checkLuaName, layoutLua } from './script-layout-lua.js';
import {
  type LayoutDeclaration,
  type ReplyKind,
  RULE_COUNT,
  type ScriptLayout,
  layoutFields,
} from './script-layout.js';

function checkDistinct(layout: string, where: string, names: readonly string[]): void {
  for (const name of names) checkLuaName(layout, name);
  const twice = names.find((name, i) => names.indexOf(name) !== i);
  if (twice !== undefined) throw new Error(`Script layout ${layout}: ${where} has ${twice} twice`);
}

function replyNames(fields: readonly [string, ReplyKind][]): string[] {
  return fields.flatMap(([name, kind]) => (typeof kind === 'object' ? [...kind.bits] : [name]));
}

/** Declares a script's layout; `name` is for messages (and may be the script's own). */
export function defineScriptLayout<const D extends LayoutDeclaration>(name: string, declaration: D): ScriptLayout<D> {
  const fields = layoutFields(declaration);
  const { headKeys, headArgs, hasRules, ruleKeys, ruleArgs, replyHead, replyRule } = fields;

  checkDistinct(name, 'the head', [...headKeys, ...headArgs.map(([n]) => n), ...(hasRules ? [RULE_COUNT] : [])]);
  checkDistinct(name, 'a rule', [...ruleKeys, ...ruleArgs.map(([n]) => n)]);
  checkDistinct(name, 'the head reply', replyNames(replyHead));
  checkDistinct(name, 'a rule reply', replyNames(replyRule));
  if (!hasRules && replyRule.length > 0) throw new Error(`Script layout ${name}: a rule reply without rules`);

  return { name, declaration, lua: layoutLua(name, fields), ...layoutCodec<D>(name, fields) };
}

import { type IdentityEntryKind, parseEntry } from './identity-entry-sets.js';

/**
 * What starts the message announcing a change of each kind on the live limits' channel (no config
 * key starts with `~`): then a space and the entry changed, as stored (`[scope, identity, values?]`),
 * with when it ends (none: removed). Alone, it asks for the whole set to be read (as versions before
 * 0.3 announce every change).
 */
const NEWS: Record<IdentityEntryKind, string> = { bans: '~bans', overrides: '~overrides' };

/** A change as news carries it: the entry as stored, and when it ends (none: removed). */
export type EntryChange = [entry: [string, string, unknown], until: number | undefined];

/** The message announcing a change: the entry as stored, and when it ends; none: it was removed. */
export function newsOfChange(kind: IdentityEntryKind, member: readonly unknown[], until?: number): string {
  return `${NEWS[kind]} ${JSON.stringify(until === undefined ? [member] : [member, until])}`;
}

/** The kind of entries a message on the live limits' channel is news of; undefined: a config key's. */
export function kindOfNews(message: string): IdentityEntryKind | undefined {
  for (const kind of ['bans', 'overrides'] as const) {
    const news = NEWS[kind];
    if (message === news || (message.startsWith(news) && message[news.length] === ' ')) return kind;
  }
  return undefined;
}

/**
 * The change news of a kind carries; undefined for news without one (from an earlier version) or
 * that cannot be read, which asks for the kind to be read again.
 */
export function changeInNews(kind: IdentityEntryKind, message: string): EntryChange | undefined {
  return message.length > NEWS[kind].length ? parseChange(message.slice(NEWS[kind].length + 1)) : undefined;
}

function parseChange(text: string): EntryChange | undefined {
  try {
    const change: unknown = JSON.parse(text);
    if (!Array.isArray(change)) return undefined;
    const entry = parseEntry(JSON.stringify(change[0]));
    const until: unknown = change[1];
    if (!entry || (until !== undefined && (typeof until !== 'number' || !Number.isFinite(until)))) return undefined;
    return [entry, until as number | undefined];
  } catch {
    return undefined;
  }
}

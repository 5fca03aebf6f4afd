/** An entry held: its value (an override's; none for a ban), and when it ends, in ms. */
export interface Ending<V> {
  value: V;
  until: number;
}

export interface FreshEntry<V> extends Ending<V> {
  scope: string;
  identity: string;
}

/** Told of every entry that comes and goes, to keep a lookup of its own beside them (the banned networks). */
export interface EntryIndex {
  add(scope: string, identity: string): void;
  remove(scope: string, identity: string): void;
  clear(): void;
}

/**
 * Entries of one kind in memory, per rule or config key (`scope`) and identity, each ending at its
 * time. Those that ended are dropped, all at once, by the first lookup, count or listing at or past
 * the earliest end held: a lookup costs a comparison more, and the room an entry took is free again
 * once it ends, whether or not its identity comes back.
 */
export class EndingEntries<V> {
  private byScope = new Map<string, Map<string, Ending<V>>>();
  private held = 0;
  /** When the first entry held ends: until then, none needs dropping. */
  private firstEnd = Number.POSITIVE_INFINITY;

  /** @param index told of each entry added and removed. */
  constructor(private readonly index?: EntryIndex) {}

  /** Whether any entry is in force; reads the clock only while some are held. */
  anyHeld(clock: () => number): boolean {
    if (this.held === 0) return false;
    this.dropEnded(clock());
    return this.held > 0;
  }

  /** The entry in force for an identity, or undefined. */
  get(scope: string, identity: string, now: number): Ending<V> | undefined {
    this.dropEnded(now);
    return this.byScope.get(scope)?.get(identity);
  }

  /** The entry held, ended or not: to keep an override's values the same object across reads. */
  peek(scope: string, identity: string): Ending<V> | undefined {
    return this.byScope.get(scope)?.get(identity);
  }

  has(scope: string, identity: string): boolean {
    return this.byScope.get(scope)?.has(identity) ?? false;
  }

  /** How many are in force. */
  count(now: number): number {
    this.dropEnded(now);
    return this.held;
  }

  list(now: number): FreshEntry<V>[] {
    this.dropEnded(now);
    return [...this.byScope].flatMap(([scope, byIdentity]) =>
      [...byIdentity].map(([identity, { value, until }]) => ({ scope, identity, value, until })),
    );
  }

  set(scope: string, identity: string, value: V, until: number): void {
    let byIdentity = this.byScope.get(scope);
    if (!byIdentity) this.byScope.set(scope, (byIdentity = new Map()));
    if (!byIdentity.has(identity)) {
      this.held += 1;
      this.index?.add(scope, identity);
    }
    byIdentity.set(identity, { value, until });
    this.firstEnd = Math.min(this.firstEnd, until);
  }

  delete(scope: string, identity: string): void {
    const byIdentity = this.byScope.get(scope);
    if (!byIdentity?.delete(identity)) return;
    this.held -= 1;
    this.index?.remove(scope, identity);
    if (byIdentity.size === 0) this.byScope.delete(scope);
  }

  /** In place of every entry held: those read from the store. */
  replaceAll(entries: readonly FreshEntry<V>[]): void {
    this.byScope = new Map();
    this.held = 0;
    this.firstEnd = Number.POSITIVE_INFINITY;
    this.index?.clear();
    for (const { scope, identity, value, until } of entries) this.set(scope, identity, value, until);
  }

  private dropEnded(now: number): void {
    if (now < this.firstEnd) return;
    let firstEnd = Number.POSITIVE_INFINITY;
    for (const [scope, byIdentity] of this.byScope) {
      for (const [identity, { until }] of byIdentity) {
        if (until > now) firstEnd = Math.min(firstEnd, until);
        else {
          byIdentity.delete(identity);
          this.held -= 1;
          this.index?.remove(scope, identity);
        }
      }
      if (byIdentity.size === 0) this.byScope.delete(scope);
    }
    this.firstEnd = firstEnd;
  }
}

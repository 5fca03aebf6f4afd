import { describe, expect, it } from 'vitest';
import { IdentityEntries, MAX_IDENTITY_ENTRIES } from './identity-entries.js';

/** Entries held in this process alone (as `MemoryConfigCentre` keeps them), on a clock the test moves. */
function heldHere() {
  const clock = { now: 1_000_000 };
  return { clock, entries: new IdentityEntries('rl', () => clock.now) };
}

describe('IdentityEntries without Redis', () => {
  it('holds no ban once every ban has ended, so requests are looked up no more', async () => {
    const { clock, entries } = heldHere();
    await entries.ban('Api.search', '198.51.100.1', clock.now + 60_000);
    await entries.ban('*', '198.51.100.2', clock.now + 120_000);
    expect(entries.anyBans).toBe(true);
    clock.now += 60_000;
    expect(entries.banUntil('Api.search', '198.51.100.1', clock.now)).toBeUndefined();
    expect(entries.anyBans).toBe(true);
    clock.now += 60_000;
    expect(entries.anyBans).toBe(false);
    expect(await entries.listBans()).toEqual([]);
  });

  it('holds no override once every override has ended', async () => {
    const { clock, entries } = heldHere();
    await entries.setOverride('exports', 'acme', { count: 5 }, clock.now + 1_000);
    expect(entries.overrideOf('exports', 'acme', clock.now)).toEqual({ count: 5 });
    clock.now += 1_000;
    expect(entries.anyOverrides).toBe(false);
    expect(entries.overrideOf('exports', 'acme', clock.now)).toBeUndefined();
    expect(await entries.listOverrides()).toEqual([]);
    expect(await entries.deleteOverride('exports', 'acme')).toBe(false);
  });

  it(`counts only entries in force against the ${MAX_IDENTITY_ENTRIES} held at most`, async () => {
    const { clock, entries } = heldHere();
    for (let i = 0; i < MAX_IDENTITY_ENTRIES; i += 1) await entries.ban('Api.search', `id-${i}`, clock.now + 1_000);
    await expect(entries.ban('Api.search', 'one-more', clock.now + 1_000)).rejects.toThrow(
      `At most ${MAX_IDENTITY_ENTRIES} bans are held at once`,
    );
    // Replacing one held is no more.
    await entries.ban('Api.search', 'id-0', clock.now + 2_000);
    clock.now += 1_000;
    await entries.ban('Api.search', 'one-more', clock.now + 1_000);
    expect((await entries.listBans()).map(({ identity }) => identity).sort()).toEqual(['id-0', 'one-more']);
  });
});

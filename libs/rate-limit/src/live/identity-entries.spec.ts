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

describe('IdentityEntries: bans of networks', () => {
  it('holds a ban of a network for every address in it, under its rule or every rule, until it ends', async () => {
    const { clock, entries } = heldHere();
    await entries.ban('Api.search', '198.51.100.0/24', clock.now + 60_000);
    await entries.ban('*', '2001:db8:77::/48', clock.now + 120_000);
    expect(entries.banUntil('Api.search', '198.51.100.77', clock.now)).toBe(clock.now + 60_000);
    expect(entries.banUntil('Api.search', '198.51.101.1', clock.now)).toBeUndefined();
    expect(entries.banUntil('Api.other', '198.51.100.77', clock.now)).toBeUndefined();
    // An IPv6 client as a rule counts it (its /64) and as an address, under any rule.
    expect(entries.banUntil('Api.search', '2001:db8:77:5::/64', clock.now)).toBe(clock.now + 120_000);
    expect(entries.banUntil('*', '2001:db8:77:5::9', clock.now)).toBe(clock.now + 120_000);
    expect(entries.banUntil('Api.search', '2001:db8:78::/64', clock.now)).toBeUndefined();
    // A client counted per prefix wider than the network is not all in it.
    expect(entries.banUntil('Api.search', '2001:db8::/32', clock.now)).toBeUndefined();
    // Identities that are no address are not looked up as one.
    expect(entries.banUntil('Api.search', 'acme', clock.now)).toBeUndefined();

    clock.now += 60_000;
    expect(entries.banUntil('Api.search', '198.51.100.77', clock.now)).toBeUndefined();
    expect(await entries.unban('*', '2001:db8:77::/48')).toBe(true);
    expect(entries.banUntil('Api.search', '2001:db8:77:5::/64', clock.now)).toBeUndefined();
    expect(entries.anyBans).toBe(false);
  });

  it('the longest of the bans holding an address says when it ends: its own, a /24, a /16', async () => {
    const { clock, entries } = heldHere();
    await entries.ban('Api.search', '203.0.113.7', clock.now + 1_000);
    await entries.ban('Api.search', '203.0.113.0/24', clock.now + 3_000);
    await entries.ban('*', '203.0.0.0/16', clock.now + 2_000);
    expect(entries.banUntil('Api.search', '203.0.113.7', clock.now)).toBe(clock.now + 3_000);
    expect(entries.banUntil('Api.other', '203.0.5.5', clock.now)).toBe(clock.now + 2_000);
    await entries.ban('*', '0.0.0.0/0', clock.now + 5_000);
    expect(entries.banUntil('Api.other', '192.0.2.1', clock.now)).toBe(clock.now + 5_000);
  });

  it(`finds the one network among ${MAX_IDENTITY_ENTRIES} that holds an address`, async () => {
    const { clock, entries } = heldHere();
    for (let i = 0; i < MAX_IDENTITY_ENTRIES; i += 1) {
      await entries.ban('*', `10.${i >> 8}.${i & 0xff}.0/24`, clock.now + 1_000 + i);
    }
    expect(entries.banUntil('Api.search', '10.39.15.200', clock.now)).toBe(clock.now + 1_000 + (39 << 8) + 15);
    expect(entries.banUntil('Api.search', '10.40.0.1', clock.now)).toBeUndefined();
  });
});

import { Controller, Get, type INestApplication } from '@nestjs/common';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RateLimit, RateLimitConfigurationError, RateLimitModule } from 'nest-rate-limit';
import {
  MemoryRateLimitStore,
  type RateLimitConsumption,
  type RateLimitHit,
  RateLimitStore,
  type RateLimitSettlement,
} from 'nest-rate-limit/store';
import { STORES, sharedRedis } from '../support/matrix.js';
import { createStore, hit } from '../support/store-module.js';
import { createTestApp, uniquePrefix } from '../support/test-app.js';
import { statuses } from '../support/traffic.js';

/** A store of a user's own, as the `store` option takes it: here one that keeps a journal and delegates. */
class JournalledStore extends RateLimitStore {
  readonly description = 'journalled store (tests)';
  readonly journal: string[] = [];
  private readonly inner = new MemoryRateLimitStore(1_000);

  consume(hits: readonly RateLimitHit[], now?: number): Promise<RateLimitConsumption> {
    this.journal.push(`consume ${hits.map((h) => h.key).join(',')}`);
    return this.inner.consume(hits, now);
  }

  settle(settlements: readonly RateLimitSettlement[]): Promise<void> {
    this.journal.push(`settle ${settlements.length}`);
    return this.inner.settle(settlements);
  }

  record(hits: readonly RateLimitHit[], now?: number): Promise<void> {
    return this.inner.record(hits, now);
  }

  reset(keys: readonly string[]): Promise<void> {
    this.journal.push(`reset ${keys.length}`);
    return this.inner.reset(keys);
  }
}

/** The library's stores, and one of a user's own given with the `store` option. */
const stores: { name: string; options: () => Promise<Parameters<typeof createStore>[0]> }[] = [
  ...STORES.map((store) => ({ name: store.name, options: async () => ({ redis: await store.redis() }) })),
  { name: 'a store of your own (store option)', options: () => Promise.resolve({ store: new JournalledStore() }) },
];

/** What every store keeps; a store of your own can be run against the same. */
describe.each(stores)('the store contract: $name', ({ options }) => {
  let store: RateLimitStore;
  let close: () => Promise<void>;
  const t0 = 1_800_000_000_000;

  beforeAll(async () => {
    ({ store, close } = await createStore(await options()));
  });

  afterAll(async () => {
    await close?.();
  });

  const keys = () => `${uniquePrefix()}:{contract}`;

  it('admits every rule of a request or none: a rejection by one moves no counter of the others', async () => {
    const base = keys();
    const roomy = hit(`${base}:roomy:fw`, { limit: 10, windowMs: 60_000 });
    const tight = hit(`${base}:tight:fw`, { limit: 1, windowMs: 60_000 });
    expect((await store.consume([roomy, tight], t0)).allowed).toBe(true);
    const refused = await store.consume([roomy, tight], t0);
    expect(refused.allowed).toBe(false);
    expect(refused.receipts).toBeUndefined();
    expect(refused.decisions.map((d) => d.allowed)).toEqual([true, false]);
    expect(refused.decisions[1].resetMs).toBeGreaterThan(0);
    // The roomy rule still has 9: the refused request took nothing from it.
    expect((await store.consume([roomy], t0)).decisions[0].remaining).toBe(8);
  });

  it('takes units back on a refunding settle, keeps them on a keeping one', async () => {
    const rule = hit(`${keys()}:r:fw`, { limit: 2, windowMs: 60_000 });
    const first = await store.consume([rule], t0);
    await store.settle([{ hit: rule, receipt: first.receipts![0], refund: true }]);
    const second = await store.consume([rule], t0);
    expect(second.decisions[0].remaining).toBe(1);
    await store.settle([{ hit: rule, receipt: second.receipts![0], refund: false }]);
    expect((await store.consume([rule], t0)).decisions[0].remaining).toBe(0);
  });

  it('records units admitted elsewhere without refusing, past the limit', async () => {
    const rule = hit(`${keys()}:r:fw`, { limit: 2, windowMs: 60_000 });
    await store.record([{ ...rule, cost: 3 }], t0);
    const refused = await store.consume([rule], t0);
    expect(refused.allowed).toBe(false);
    expect(refused.decisions[0].remaining).toBe(0);
  });

  it('marks a countOn rejection caused only by admissions in flight provisional, and starts no penalty', async () => {
    const rule = hit(`${keys()}:r:fw`, { limit: 1, windowMs: 60_000, blockMs: 60_000, conditional: true });
    const admitted = await store.consume([rule], t0);
    const turnedAway = await store.consume([rule], t0);
    expect(turnedAway.decisions[0]).toMatchObject({ allowed: false, provisional: true });
    await store.settle([{ hit: rule, receipt: admitted.receipts![0], refund: true }]);
    // Refunded: the next is admitted, so no penalty was started.
    expect((await store.consume([rule], t0)).allowed).toBe(true);
  });

  it("holds a settleCost admission's claim against the others until it settles, or 10 minutes at most", async () => {
    const key = `${keys()}:r:fw`;
    // 100 an hour; `overdraftBound`: what an admission may yet be charged past its cost.
    const budget = (cost: number, overdraftBound: number) =>
      hit(key, { limit: 100, windowMs: 3_600_000, blockMs: 60_000, cost, overdraftBound });
    const first = await store.consume([budget(10, 50)], t0);
    expect(first.allowed).toBe(true);
    // 10 counted and 50 more at most in flight: 50 do not fit. Nothing is left while it runs; no penalty.
    const turnedAway = await store.consume([budget(50, 0)], t0 + 1);
    expect(turnedAway.decisions[0]).toMatchObject({ allowed: false, remaining: 0, provisional: true });
    expect(turnedAway.decisions[0].resetMs).toBeLessThanOrEqual(600_000);
    // Settled, its reservation kept: the claim ends, and 50 fit.
    await store.settle([{ hit: budget(10, 50), receipt: first.receipts![0], refund: false }]);
    expect((await store.consume([budget(50, 0)], t0 + 2)).allowed).toBe(true);
    // A charge that settles one ends its claim in the same call.
    const charged = await store.consume([budget(10, 30)], t0 + 3);
    expect((await store.consume([budget(10, 0)], t0 + 4)).allowed).toBe(false);
    await store.record([{ ...budget(5, 30), settles: charged.receipts![0].nonce }], t0 + 5);
    expect((await store.consume([budget(10, 0)], t0 + 6)).allowed).toBe(true);
    // 85 counted: a claim never settled holds 10 minutes, though the window runs an hour.
    expect((await store.consume([budget(5, 10)], t0 + 7)).allowed).toBe(true);
    expect((await store.consume([budget(5, 0)], t0 + 8)).allowed).toBe(false);
    expect((await store.consume([budget(5, 0)], t0 + 7 + 600_001)).allowed).toBe(true);
  });

  it('forgets a key on reset: its count, its penalty and its admissions in flight', async () => {
    const base = keys();
    const counted = hit(`${base}:counted:fw`, { limit: 2, windowMs: 60_000 });
    const penalised = hit(`${base}:penalised:fw`, { limit: 1, windowMs: 60_000, blockMs: 600_000 });
    const pending = hit(`${base}:pending:fw`, { limit: 1, windowMs: 60_000, conditional: true });
    const other = hit(`${base}:other:fw`, { limit: 2, windowMs: 60_000 });
    for (const rule of [counted, counted, penalised, penalised, pending, other]) await store.consume([rule], t0);
    expect((await store.consume([penalised], t0 + 60_001)).allowed).toBe(false);
    expect((await store.consume([pending], t0)).decisions[0].provisional).toBe(true);

    await store.reset([counted.key, penalised.key, pending.key]);
    expect((await store.consume([counted], t0)).decisions[0].remaining).toBe(1);
    expect((await store.consume([penalised], t0 + 60_001)).allowed).toBe(true);
    expect((await store.consume([pending], t0)).allowed).toBe(true);
    // Only the given keys: another rule keeps its count.
    expect((await store.consume([other], t0)).decisions[0].remaining).toBe(0);
  });
});

@Controller('own-store')
class OwnStoreController {
  @Get()
  @RateLimit(3, '10s')
  get() {
    return { ok: true };
  }
}

describe('the store option', () => {
  let app: INestApplication;
  const store = new JournalledStore();

  beforeAll(async () => {
    app = await createTestApp({ controllers: [OwnStoreController], rateLimit: { store, keyPrefix: uniquePrefix() } });
  });

  afterAll(() => app?.close());

  it('decides every request with the given store: 200, 200, 200, 429', async () => {
    expect(await statuses(app, '/own-store', 4)).toEqual([200, 200, 200, 429]);
    expect(store.journal.filter((line) => line.startsWith('consume'))).toHaveLength(4);
  });

  it('refuses at bootstrap a value that is no RateLimitStore, naming the field', () => {
    expect(() => RateLimitModule.forRoot({ store: {} as RateLimitStore })).toThrow(RateLimitConfigurationError);
    expect(() => RateLimitModule.forRoot({ store: {} as RateLimitStore })).toThrow(/'store' must be/);
  });
});

/** A `concurrency` cap's slots, as the library's stores keep them (`renewSlots`). */
describe.each(STORES)('slots of a concurrency cap: $name store', (storeCase) => {
  let store: RateLimitStore;
  let close: () => Promise<void>;
  const t0 = 1_800_000_000_000;
  const lease = 30_000;
  const slotHit = () =>
    hit(`${uniquePrefix()}:{slots}:cap:sl`, { algorithm: 'sliding-log', limit: 2, windowMs: lease, slot: true });

  beforeAll(async () => {
    ({ store, close } = await createStore({ redis: await storeCase.redis() }));
  });

  afterAll(async () => {
    await close?.();
  });

  it('keeps a renewed slot past its first lease, and lets one not renewed run out', async () => {
    const cap = slotHit();
    const renewed = await store.consume([cap], t0);
    const lapsed = await store.consume([cap], t0 + 1);
    expect([renewed.allowed, lapsed.allowed]).toEqual([true, true]);
    expect((await store.consume([cap], t0 + 2)).allowed).toBe(false);
    const [at] = await store.renewSlots([{ hit: cap, receipt: renewed.receipts![0] }], t0 + lease - 5_000);
    expect(at).toBe(t0 + lease - 5_000);
    // Past the first lease: the lapsed slot is back, the renewed one still held.
    const past = await store.consume([cap], t0 + lease + 10);
    expect(past.allowed).toBe(true);
    expect(past.decisions[0].remaining).toBe(0);
    // Renewed again, by its receipt dated as the renewal answered (as `ConcurrencyStep` keeps it).
    const moved = { hit: cap, receipt: { ...renewed.receipts![0], admittedAt: at! } };
    expect(await store.renewSlots([moved], t0 + lease + 20)).toEqual([t0 + lease + 20]);
  });

  it('renews no slot whose lease ran out: others were admitted in its place', async () => {
    const cap = slotHit();
    const lapsed = await store.consume([cap], t0);
    // Past its lease, unrenewed (a stalled instance): two others take both slots.
    const others = [await store.consume([cap], t0 + lease + 1), await store.consume([cap], t0 + lease + 2)];
    expect(others.map(({ allowed }) => allowed)).toEqual([true, true]);
    expect(await store.renewSlots([{ hit: cap, receipt: lapsed.receipts![0] }], t0 + lease + 3)).toEqual([undefined]);
    const next = await store.consume([cap], t0 + lease + 4);
    expect(next.allowed).toBe(false);
    // Two held, not three: the lapsed slot did not come back to life.
    await store.settle([{ hit: cap, receipt: others[0].receipts![0], refund: true }]);
    expect((await store.consume([cap], t0 + lease + 5)).allowed).toBe(true);
  });

  it('gives a renewed slot back, and then renews nothing', async () => {
    const cap = slotHit();
    const admitted = await store.consume([cap], t0);
    const [at] = await store.renewSlots([{ hit: cap, receipt: admitted.receipts![0] }], t0 + 10_000);
    const slot = { hit: cap, receipt: { ...admitted.receipts![0], admittedAt: at! } };
    await store.settle([{ ...slot, refund: true }]);
    const after = await store.consume([cap], t0 + 10_001);
    expect(after.decisions[0].remaining).toBe(1);
    expect(await store.renewSlots([slot], t0 + 10_002)).toEqual([undefined]);
  });
});

describe('slots of a concurrency cap on Redis: a request that ends while its slot is being renewed', () => {
  let store: RateLimitStore;
  let close: () => Promise<void>;
  const t0 = 1_800_000_000_000;

  beforeAll(async () => {
    ({ store, close } = await createStore({ redis: (await sharedRedis()).url }));
  });

  afterAll(async () => {
    await close?.();
  });

  it('gives the slot back by the receipt it had before the renewal answered', async () => {
    const cap = hit(`${uniquePrefix()}:{slots}:cap:sl`, {
      algorithm: 'sliding-log',
      limit: 1,
      windowMs: 30_000,
      slot: true,
    });
    const admitted = await store.consume([cap], t0);
    const first = { hit: cap, receipt: admitted.receipts![0] };
    await store.renewSlots([first], t0 + 10_000);
    await store.settle([{ ...first, refund: true }]);
    expect((await store.consume([cap], t0 + 10_001)).allowed).toBe(true);
  });
});

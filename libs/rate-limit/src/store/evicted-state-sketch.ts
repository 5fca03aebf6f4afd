import { randomInt } from 'node:crypto';

/** Cells per key, one in each row: a key reads too high only when every one of them is shared. */
const ROWS = 4;

/**
 * What keys evicted from a bounded map still held, in fixed memory: for any key, a figure never
 * lower than the units it held when evicted, for as long as they can matter. A count-min table
 * that keeps maxima instead of sums: a key is folded into one cell of each row, each cell keeping
 * the most units, the latest end and the latest write time of the keys folded into it, and a key
 * reads the least of its cells. A cell that has ended is overwritten.
 *
 * A key that was never folded in reads above 0 only when all its cells hold other keys (a false
 * positive): it is charged at most what those keys held, and for no longer than its own rule's
 * longest state after the last of them was folded in, so a key of a short window is not charged
 * for as long as keys of long windows sharing its cells live. With `keys` evicted keys whose
 * states still matter, that is about `(1 - e^(-keys / width))^4` of the keys read: at most 1 in 40
 * for `keys` up to the `keys` it was sized for. Far more evicted keys than that (a flood) make most
 * reads high until the flood's states end, and a key charged by mistake is folded back in with
 * those units as its own: bounded memory cannot tell the keys apart, and reading high is the side
 * that gives no one budget back.
 *
 * Memory: 4 rows of `width` cells (the power of two in [2 x keys, 4 x keys)) of 3 doubles each,
 * allocated at the first fold: at most 48 x keys doubles.
 */
export class EvictedStateSketch {
  private readonly width: number;
  private readonly seed = randomInt(2 ** 32);
  private cells: { units: Float64Array; until: Float64Array; writtenBy: Float64Array } | undefined;
  // The key's two hashes; fields so that a read allocates nothing.
  private firstHash = 0;
  private stepHash = 0;

  /** @param keys how many evicted keys may matter at once before reads start to be too high. */
  constructor(keys: number) {
    this.width = 2 ** Math.ceil(Math.log2(2 * Math.max(1, keys)));
  }

  /**
   * Folds in an evicted key.
   * @param units what its state held, at most, from now until `until`.
   * @param writtenBy a time no earlier than the state's last write.
   */
  add(key: string, units: number, until: number, writtenBy: number, now: number): void {
    if (until <= now) return;
    this.cells ??= {
      units: new Float64Array(ROWS * this.width),
      until: new Float64Array(ROWS * this.width),
      writtenBy: new Float64Array(ROWS * this.width),
    };
    const cells = this.cells;
    this.hash(key);
    for (let row = 0; row < ROWS; row += 1) {
      const cell = this.cellOf(row);
      if (cells.until[cell] <= now) {
        cells.units[cell] = units;
        cells.until[cell] = until;
        cells.writtenBy[cell] = writtenBy;
      } else {
        cells.units[cell] = Math.max(cells.units[cell], units);
        cells.until[cell] = Math.max(cells.until[cell], until);
        cells.writtenBy[cell] = Math.max(cells.writtenBy[cell], writtenBy);
      }
    }
  }

  /**
   * What `key` held when it was evicted, from above: at least its units, until no earlier than its
   * state's end; undefined when nothing it held can matter now.
   * @param lifetimeMs the longest a state of the key's rule matters after its last write.
   */
  lookup(key: string, lifetimeMs: number, now: number): { units: number; until: number } | undefined {
    const cells = this.cells;
    if (!cells) return undefined;
    this.hash(key);
    let units = Infinity;
    let until = Infinity;
    for (let row = 0; row < ROWS; row += 1) {
      const cell = this.cellOf(row);
      // Whatever the key held here ended by the cell's end, and a lifetime after the cell's last write.
      const end = Math.min(cells.until[cell], cells.writtenBy[cell] + lifetimeMs);
      if (end <= now) return undefined;
      units = Math.min(units, cells.units[cell]);
      until = Math.min(until, end);
    }
    return { units, until };
  }

  private cellOf(row: number): number {
    return row * this.width + ((this.firstHash + Math.imul(row, this.stepHash)) & (this.width - 1));
  }

  /**
   * Two 32-bit hashes in one pass (FNV-1a and a multiply-xorshift), seeded per instance so that
   * keys colliding with a chosen victim cannot be computed offline; rows index by double hashing.
   */
  private hash(key: string): void {
    let a = 0x811c9dc5 ^ this.seed;
    let b = 0x9747b28c ^ Math.imul(this.seed, 0x85ebca6b);
    for (let i = 0; i < key.length; i += 1) {
      const code = key.charCodeAt(i);
      a = Math.imul(a ^ code, 0x01000193);
      b = Math.imul(b ^ code, 0x5bd1e995);
      b ^= b >>> 15;
    }
    this.firstHash = finalMix(a);
    this.stepHash = finalMix(b);
  }
}

/** MurmurHash3's finalizer: every input bit moves about half the output bits. */
function finalMix(hash: number): number {
  let h = hash;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return h ^ (h >>> 16);
}

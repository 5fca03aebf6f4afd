/**
 * What GCRA keeps in Redis: no hash, but a plain string at the state key holding the theoretical
 * arrival time (ms on the store's clock, possibly fractional), written with `%.17g` so it reads
 * back exactly.
 */
export const GCRA_REDIS_TYPE = 'string';
